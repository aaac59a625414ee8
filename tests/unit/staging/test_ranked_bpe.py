"""tiktoken as the encoder of a tokenizer whose merge order is its token order: the same ids as the tokenizer's own
backend, or not used at all."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_tiktoken_reproduces_the_tokenizer_on_awkward_text(builtin_tokenizer) -> None:
    """Beyond the probe RankedBPE.of runs: 3,000 other random texts (every script, Unicode whitespace, digits,
    contractions, emoji, added tokens) give the same ids from tiktoken and from the tokenizer's backend; a
    tokenizer whose merges are not in its tokens' order, or that changes text otherwise than NFC, is not given
    to tiktoken."""
    import json

    from tokenizers import Tokenizer, normalizers

    from staging import ranked_bpe
    from staging.ranked_bpe import RankedBPE

    backend = Tokenizer.from_file(str(Path(builtin_tokenizer) / "tokenizer.json"))
    bpe = RankedBPE.of(backend)
    assert bpe is not None
    added = [t.content for t in backend.get_added_tokens_decoder().values()]
    texts = ranked_bpe.probe_texts(added, 3400)[400:]  # the first 400 are the probe's own
    ours = bpe.encode(texts)
    theirs = [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]
    assert sum(a == b for a, b in zip(ours, theirs, strict=True)) == len(texts)
    with pytest.raises(RuntimeError, match="tiktoken and the tokenizer encode 'two plus two'"):
        bpe.check(backend, "two plus two", ours[0])  # the tripwire every batch's first text goes through

    spec = json.loads(backend.to_str())
    spec["model"]["merges"] = list(reversed(spec["model"]["merges"]))
    assert RankedBPE.of(Tokenizer.from_str(json.dumps(spec))) is None
    backend.normalizer = normalizers.Lowercase()
    assert RankedBPE.of(backend) is None
