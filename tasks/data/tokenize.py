"""Tokenize conversations once, with the model's own chat template, masking labels to assistant turns.

The template is rendered for the whole conversation; each assistant turn's character span is found by
rendering the prefix before it (with the generation prompt) and the prefix through it. Tokens whose
start offset falls inside such a span are targets; all others get -100 (Hugging Face's convention;
the model shifts labels by one internally).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from config.errors import UserError

IGNORE_INDEX = -100


@dataclass(frozen=True)
class Encoded:
    """Token ids, labels, and whether the example was cut at max_length."""

    input_ids: list[int]
    labels: list[int]
    truncated: bool


def assistant_spans(tokenizer: Any, messages: list[dict[str, str]]) -> list[tuple[int, int]]:
    """Character spans [start, end) of each assistant turn (content and end-of-turn) in the rendering."""
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(tokenizer.apply_chat_template(messages[:index], tokenize=False, add_generation_prompt=True))
        end = len(tokenizer.apply_chat_template(messages[: index + 1], tokenize=False))
        spans.append((start, end))
    return spans


def encode(tokenizer: Any, messages: list[dict[str, str]], max_length: int, location: str) -> Encoded:
    """One conversation as (input_ids, labels), truncated to max_length tokens."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = assistant_spans(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    labels = [
        tok if any(start <= begin < end for start, end in spans) else IGNORE_INDEX
        for tok, (begin, _) in zip(ids, offsets, strict=True)
    ]
    if not any(label != IGNORE_INDEX for label in labels):
        raise UserError(f"{location}: the chat template left no assistant tokens; check the tokenizer's template")
    truncated = len(ids) > max_length
    return Encoded(ids[:max_length], labels[:max_length], truncated)


def tokenizer_fingerprint(model_path: str) -> dict[str, Any]:
    """What identifies a tokenizer's behaviour: digests of its files (the chat template among them)."""
    from pathlib import Path

    from config.digest import digest_bytes

    files = {}
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                 "vocab.json", "merges.txt"):
        path = Path(model_path) / name
        if path.exists():
            files[name] = digest_bytes(path.read_bytes(), "blake3")
    return {"files": files}
