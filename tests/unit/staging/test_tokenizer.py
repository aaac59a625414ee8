"""The model's tokenizer as staging uses it: loaded with model.chat_template when set (a chat template required for
chat data), fingerprinted by its files for the dataset id, and the token that ends a plain-text document."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from core.errors import UserError
from staging.tokenizer import document_end, load_tokenizer, tokenizer_fingerprint

TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"


def bare_copy(tiny_model: str, folder: Path) -> str:
    """The tiny model's tokenizer without its chat template (a base model's)."""
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tiny_model) / name, folder / name)
    return str(folder)


def test_a_template_is_required_for_chat_unless_given(tiny_model, tmp_path) -> None:
    bare = bare_copy(tiny_model, tmp_path / "bare")
    with pytest.raises(UserError, match=rf"^model.name_or_path {bare}: the tokenizer has no chat template, which chat"):
        load_tokenizer(bare)
    assert load_tokenizer(bare, require_template=False).chat_template is None
    given = load_tokenizer(bare, TEMPLATE)
    assert given.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "user: hi\n"
    assert load_tokenizer(tiny_model).is_fast


def test_the_fingerprint_follows_the_files_and_the_template_text(tiny_model, tmp_path) -> None:
    bare = bare_copy(tiny_model, tmp_path / "bare")
    plain = tokenizer_fingerprint(bare)
    assert sorted(plain["files"]) == ["tokenizer.json", "tokenizer_config.json"]
    assert tokenizer_fingerprint(bare) == plain and "chat_template" not in plain
    assert (
        tokenizer_fingerprint(bare, TEMPLATE)["chat_template"]
        != tokenizer_fingerprint(bare, TEMPLATE + " ")["chat_template"]
    )
    (Path(bare) / "chat_template.jinja").write_text(TEMPLATE)
    assert tokenizer_fingerprint(bare)["files"]["chat_template.jinja"] and tokenizer_fingerprint(bare) != plain
    with pytest.raises(UserError, match=rf"model.name_or_path {tmp_path}: no tokenizer files \(tokenizer.json,"):
        tokenizer_fingerprint(str(tmp_path))


def test_a_document_ends_with_the_end_of_text_token_not_the_chat_turns_end(tiny_model) -> None:
    tokenizer = load_tokenizer(tiny_model)
    assert tokenizer.eos_token == "<|im_end|>" and document_end(tokenizer) == "<|endoftext|>"
