"""The model's tokenizer as staging uses it: loaded (a fast one, with model.chat_template when set), identified by the
digests of its files (part of the dataset id), and the token that ends a plain-text document."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from config.vision import PREPROCESSOR_CONFIG
from core.errors import UserError
from storage.digest import digest_bytes

DOCUMENT_ENDS = ("<|endoftext|>", "<|end_of_text|>")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "vocab.txt",
    PREPROCESSOR_CONFIG,  # a vision-language model's image processor: how many tokens each image becomes
)


def load_tokenizer(
    model_path: str,
    chat_template: str | None = None,
    *,
    require_template: bool = True,
    trust_remote_code: bool = False,
) -> Any:
    """The model's tokenizer (a fast one: offsets are needed to place the labels), with `chat_template` if given.
    Without `require_template` a tokenizer without a chat template is returned as it is (a base model's, for
    plain-text data); ChatEncoder then refuses chat records with `no_template_error`'s message. `trust_remote_code`
    (model.trust_remote_code) lets a directory's own tokenizer or configuration code run."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    if not getattr(tokenizer, "is_fast", False):
        raise UserError(
            f"model.name_or_path {model_path}: the tokenizer is not a fast (tokenizers) one; "
            "add its tokenizer.json (Tandem needs token offsets to place the labels)"
        )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    if tokenizer.chat_template is None and require_template:
        raise no_template_error(model_path)
    return tokenizer


def no_template_error(model_path: str) -> UserError:
    """Chat data for a tokenizer without a chat template (plain-text data needs none)."""
    return UserError(
        f"model.name_or_path {model_path}: the tokenizer has no chat template, which chat data is "
        "rendered with; add chat_template.jinja to the model directory or set model.chat_template "
        "(plain-text data, data.format text, needs none)"
    )


def document_end(tokenizer: Any) -> str | None:
    """The token that ends a plain-text document: `<|endoftext|>` (Qwen, GPT-2) or `<|end_of_text|>` (Llama 3)
    when the vocabulary has one, since a chat model's eos_token ends a chat turn (`<|im_end|>`); else eos_token."""
    backend = tokenizer.backend_tokenizer
    for token in DOCUMENT_ENDS:
        if backend.token_to_id(token) is not None:
            return token
    if tokenizer.eos_token is None:  # only plain text needs one: staging chat data goes on
        return None
    return str(tokenizer.eos_token)


def tokenizer_fingerprint(model_path: str, chat_template: str | None = None) -> dict[str, Any]:
    """What identifies a tokenizer's behaviour: digests of its files (the chat template among them), and of
    model.chat_template's text when it replaces the tokenizer's."""
    files = {}
    for name in TOKENIZER_FILES:
        path = Path(model_path) / name
        if path.exists():
            files[name] = digest_bytes(path.read_bytes(), "blake3")
    if not files:
        raise UserError(
            f"model.name_or_path {model_path}: no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, "
            "...); give a Hugging Face model directory"
        )
    if chat_template is not None:
        return {"files": files, "chat_template": digest_bytes(chat_template.encode("utf-8"), "blake3")}
    return {"files": files}
