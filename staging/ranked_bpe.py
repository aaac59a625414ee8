"""A faster encoder for byte-level BPE tokenizers whose merge order is their token order: tiktoken, built from the
same tokenizer.json. Qwen2/2.5/3 (whose vocabulary began as a tiktoken file) and tokenizers trained with
`tokenizers`' BpeTrainer qualify.

Tokenizing is nearly all of staging's time. tiktoken encodes the same texts about 3.6 times faster than the backend's
`encode_batch_fast` on one core (`python tests/benchmarks/bench_prepare.py --parts e` prints the staging's rate). Both
run the same algorithm: split the text at added tokens, split the rest with the pre-tokenizer's regex, then merge
byte pairs by priority. tiktoken's priority is the rank of the merged token and the tokenizer's is the merge's place
in its list, so the two agree when the ids follow the merges.

It is used only when everything around the merges is plain too. This is checked on the tokenizer.json: a BPE model
without byte fallback, dropout or affixes; normalizer none or NFC; pre-tokenizer a regex Split then ByteLevel
without a prefix space; added tokens that strip nothing. Then it must reproduce the backend on a probe of awkward
text: every script, Unicode whitespace, digits, contractions, emoji, added tokens. Texts an NFC normalizer would
change go to the backend (tokenize.py, through offsets.py's check). Every batch's first text is also encoded by the
backend, and a difference stops the staging with a RuntimeError rather than letting the data diverge from the
model's tokenizer.
"""

from __future__ import annotations

import json
import logging
import unicodedata
from typing import Any

from staging.offsets import byte_values

log = logging.getLogger(__name__)

_PROBE_POOLS = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    " \t\n\r\x0b\x0c",
    "\u00a0\u2000\u2003\u3000\u2028\u2029\u0085\u200b\ufeff\x1c\x1f",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "\u2019\u2018\u201c\u201d\u00ab\u00bb\u2014\u2013\u2026",
    "\u00e9\u00e8\u00ea\u00e0\u00e4\u00f6\u00fc\u00e7\u00f1\u00df",
    "\u0430\u0431\u0432\u0433\u0434\u0435\u0436\u0437\u044f",
    "\u03b1\u03b2\u03b3\u03b4\u03c9",
    "\u65e5\u672c\u8a9e\u4e2d\u6587\ud55c\uad6d\uc5b4",
    "\u0e44\u0e17\u0e22",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    "\u0939\u093f\u0928\u094d\u0926\u0940",
    "\U0001f600\U0001f389\U0001f468\u200d\U0001f469\u200d\U0001f467\U0001f44d\U0001f3fd",
    "\u216b\u00bd\u00b2\u2460",
    "'s'S't're've'm'll'd'",
    "\x00\x01\x7f\x80\u00ad",
)


class RankedBPE:
    """tiktoken's encoder of one tokenizer's vocabulary, regex and added tokens."""

    def __init__(self, encoding: Any) -> None:
        self.encoding = encoding

    @classmethod
    def of(cls, backend: Any, spec: dict[str, Any] | None = None) -> RankedBPE | None:
        """The encoder for a `tokenizers.Tokenizer` (`spec`: its tokenizer.json, parsed), or None (with the reason
        logged) where it would not be exact."""
        try:
            import tiktoken
        except ImportError:
            return None
        spec = spec or json.loads(backend.to_str())
        problem = _unsupported(spec)
        if problem:
            log.debug("tokenizing with the tokenizer's own backend: %s", problem)
            return None
        ranks = _ranks(spec["model"]["vocab"])
        if ranks is None or len(set(ranks.values())) != len(ranks) or not all(bytes([b]) in ranks for b in range(256)):
            return None
        added = {token["content"]: token["id"] for token in spec["added_tokens"]}
        encoding = tiktoken.Encoding(
            "tandem",
            pat_str=spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"],
            mergeable_ranks=ranks,
            special_tokens=added,
        )
        bpe = cls(encoding)
        probe = probe_texts(list(added))
        mismatch = next((text for text in probe if bpe.encode([text])[0] != _backend_ids(backend, text)), None)
        if mismatch is not None:
            log.info("tokenizing with the tokenizer's own backend: tiktoken differs on %r", mismatch[:80])
            return None
        return bpe

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, added tokens included wherever they appear (as the backend does)."""
        return [self.encoding.encode(text, allowed_special="all") for text in texts]

    def check(self, backend: Any, text: str, ids: list[int]) -> None:
        """The tripwire: the backend's ids for `text` are `ids`; else stop, naming the text."""
        if unicodedata.is_normalized("NFC", text) and _backend_ids(backend, text) != ids:
            raise RuntimeError(
                f"tiktoken and the tokenizer encode {text[:80]!r}... differently; this tokenizer is not "
                "supported by staging/ranked_bpe.py (please report it, with the tokenizer.json)"
            )


def probe_texts(added: list[str], count: int = 400) -> list[str]:
    """Deterministic awkward texts (NFC, since the others never reach tiktoken): runs from every pool, mixed, with
    added tokens between them."""
    import random

    rng = random.Random(0)
    texts: list[str] = []
    while len(texts) < count:
        parts = []
        for _ in range(rng.randint(1, 24)):
            if added and rng.random() < 0.05:
                parts.append(rng.choice(added))
            else:
                pool = rng.choice(_PROBE_POOLS)
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
        text = "".join(parts)
        if unicodedata.is_normalized("NFC", text):
            texts.append(text)
    return texts


def _backend_ids(backend: Any, text: str) -> list[int]:
    return backend.encode_batch_fast([text], add_special_tokens=False)[0].ids


def _unsupported(spec: dict[str, Any]) -> str | None:
    """Why tiktoken cannot reproduce this tokenizer.json, or None."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback") or model.get("dropout"):
        return "not a plain BPE model"
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return "BPE with subword affixes"
    if (spec.get("normalizer") or {}).get("type") not in (None, "NFC"):
        return "a normalizer other than NFC"
    steps = (spec.get("pre_tokenizer") or {}).get("pretokenizers") or []
    if not (
        len(steps) == 2
        and steps[0].get("type") == "Split"
        and "Regex" in steps[0].get("pattern", {})
        and steps[0].get("behavior") == "Isolated"
        and not steps[0].get("invert")
        and steps[1].get("type") == "ByteLevel"
        and not steps[1].get("add_prefix_space")
        and not steps[1].get("use_regex")
    ):
        return "a pre-tokenizer other than a regex Split then ByteLevel"
    if any(t.get("lstrip") or t.get("rstrip") or t.get("single_word") for t in spec.get("added_tokens", ())):
        return "added tokens that strip or match whole words"
    return _merges_out_of_order(model)


def _merges_out_of_order(model: dict[str, Any]) -> str | None:
    """tiktoken merges by the result's id: the ids of the merges' results must rise with the merges' order."""
    vocab, last = model["vocab"], -1
    for merge in model.get("merges", ()):
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        index = vocab.get(left + right)
        if index is None or index <= last:
            return "merges whose order is not their tokens' order"
        last = index
    return None


def _ranks(vocab: dict[str, int]) -> dict[bytes, int] | None:
    """Each token's bytes (byte-level BPE writes byte b as a printable character: offsets.byte_values) and its id."""
    to_byte = byte_values()
    try:
        return {bytes(to_byte[char] for char in token): index for token, index in vocab.items()}
    except KeyError:
        return None
