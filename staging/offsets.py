"""Where each token starts, without the tokenizer tracking offsets: for byte-level BPE tokenizers (Qwen, Llama 3,
GPT-2 and their kin).

Labels are placed by mapping the assistant turns' character spans to tokens, which needs each token's start. The
fast backend can track character offsets as it encodes, but that is about a third of its encoding time (`python
tests/benchmarks/bench_prepare.py --parts e` prints both). A byte-level BPE token is a fixed run of the text's
UTF-8 bytes, so its start is the sum of the byte lengths of the tokens before it: a table lookup and a cumulative
sum per example, from ids encoded without offsets.

That holds only while the model sees exactly the text's bytes, so it is used only when the tokenizer's post-processor
neither adds tokens nor trims offsets and its normalizer is none or NFC, and it is checked per example: an NFC
normalizer must find the text already normalized, and the tokens' bytes must add up to the text's. An example that
fails a check is encoded again with tracked offsets.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

import numpy as np

PASS_THROUGH_NORMALIZERS = (None, "NFC")


class ByteOffsets:
    """Token start positions (in UTF-8 bytes) from token ids, for one byte-level BPE tokenizer."""

    def __init__(self, byte_lengths: np.ndarray, nfc: bool) -> None:
        self.byte_lengths = byte_lengths  # per token id; 0 for ids that are no token (then a check fails)
        self.nfc = nfc

    @classmethod
    def of(cls, backend: Any, spec: dict[str, Any] | None = None) -> ByteOffsets | None:
        """The table for a `tokenizers.Tokenizer` (`spec`: its tokenizer.json, parsed), or None when its tokens are not
        plain runs of the text's bytes."""
        spec = spec or json.loads(backend.to_str())
        normalizer = (spec.get("normalizer") or {}).get("type")
        if spec["model"].get("type") != "BPE" or normalizer not in PASS_THROUGH_NORMALIZERS:
            return None
        if not _byte_level(spec.get("pre_tokenizer")) or not _passes_offsets_through(spec.get("post_processor")):
            return None
        alphabet = byte_values().keys()
        added = {token["id"]: token["content"] for token in spec.get("added_tokens", ())}
        lengths = np.zeros(backend.get_vocab_size(with_added_tokens=True), dtype=np.int64)
        for token, index in backend.get_vocab(with_added_tokens=True).items():
            if index in added:
                lengths[index] = len(added[index].encode("utf-8"))
            elif set(token) <= alphabet:  # one character per byte
                lengths[index] = len(token)
        return cls(lengths, nfc=normalizer == "NFC")

    def starts(self, text: str, ids: np.ndarray) -> np.ndarray | None:
        """Each token's first byte in `text` encoded as UTF-8, or None when the tokens are not exactly its bytes."""
        if self.nfc and not unicodedata.is_normalized("NFC", text):
            return None
        if ids.size and int(ids.max()) >= len(self.byte_lengths):
            return None
        lengths = self.byte_lengths[ids]
        ends = np.cumsum(lengths)
        if (ends[-1] if ids.size else 0) != len(text.encode("utf-8")) or (ids.size and not lengths.all()):
            return None
        return ends - lengths


def first_tokens_at(text: str, starts: np.ndarray, positions: list[int]) -> list[int]:
    """For each character position, the index of the first token starting at or after it (len(starts) past the
    end): what tokenize.py's search over tracked character offsets gives."""
    points = positions if text.isascii() else [len(text[:position].encode("utf-8")) for position in positions]
    return np.searchsorted(starts, points, side="left").tolist()


def _byte_level(pre_tokenizer: dict[str, Any] | None) -> bool:
    """Whether the pre-tokenizer maps the text to bytes (ByteLevel, alone or last in a Sequence)."""
    if not pre_tokenizer:
        return False
    if pre_tokenizer["type"] == "Sequence":
        steps = pre_tokenizer["pretokenizers"]
        return bool(steps) and steps[-1]["type"] == "ByteLevel" and not steps[-1].get("add_prefix_space")
    return pre_tokenizer["type"] == "ByteLevel" and not pre_tokenizer.get("add_prefix_space")


def _passes_offsets_through(post_processor: dict[str, Any] | None) -> bool:
    """Whether the post-processor leaves tokens and offsets as encoded (with add_special_tokens=False)."""
    if post_processor is None:
        return True
    kind = post_processor["type"]
    if kind == "ByteLevel":
        return not post_processor.get("trim_offsets") and not post_processor.get("add_prefix_space")
    if kind == "TemplateProcessing":
        return True  # its special tokens are added only with add_special_tokens=True, which staging never asks
    if kind == "Sequence":
        return all(_passes_offsets_through(step) for step in post_processor["processors"])
    return False


def byte_values() -> dict[str, int]:
    """The character byte-level BPE writes each byte as, and that byte (GPT-2's table): printable bytes stand for
    themselves, the others are shifted past 255."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    ]
    shifted = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(shifted)}
