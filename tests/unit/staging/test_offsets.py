"""Token starts summed from byte lengths, for byte-level BPE tokenizers: exactly the offsets the backend tracks, and
refused (None) wherever a token is not a plain run of the text's bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from staging.offsets import ByteOffsets, byte_values, first_tokens_at


def test_summed_starts_equal_the_tracked_offsets(builtin_tokenizer) -> None:
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(Path(builtin_tokenizer) / "tokenizer.json"))
    table = ByteOffsets.of(backend)
    assert table is not None
    for text in ("Hello, world!", "<|im_start|>user\nCafé — naïve 日本語 🎉\n<|im_end|>", "  spaces\tand\ttabs  "):
        encoding = backend.encode(text, add_special_tokens=False)
        starts = table.starts(text, np.array(encoding.ids))
        assert starts is not None
        characters = [begin for begin, _ in encoding.offsets]
        # The first token starting at each token's start: itself, or the first of the tokens one character splits into.
        assert first_tokens_at(text, starts, characters) == [characters.index(c) for c in characters]
        assert first_tokens_at(text, starts, [len(text)]) == [len(encoding.ids)]  # past the end
    decomposed = "cafe\u0301"  # not NFC: a tokenizer with an NFC normalizer would not see these bytes
    ids = np.array(backend.encode(decomposed, add_special_tokens=False).ids)
    assert ByteOffsets(table.byte_lengths, nfc=True).starts(decomposed, ids) is None
    assert table.starts("other text", ids) is None  # tokens that do not add up to the text's bytes


def test_every_byte_has_one_printable_character() -> None:
    table = byte_values()
    assert sorted(table.values()) == list(range(256)) and len(table) == 256
    assert table["A"] == 65 and table["\u0120"] == 32  # GPT-2's "Ġ" is the space


def test_summed_byte_offsets_are_used_only_where_tokens_are_the_texts_bytes(tiny_model) -> None:
    """A post-processor that trims offsets (or adds a prefix space) or a normalizer that rewrites text makes token
    starts differ from summed byte lengths: such tokenizers keep the tracked offsets."""
    from tokenizers import Tokenizer, normalizers, processors

    from staging.offsets import ByteOffsets

    backend = Tokenizer.from_file(str(Path(tiny_model) / "tokenizer.json"))
    assert ByteOffsets.of(backend) is not None
    backend.post_processor = processors.ByteLevel(trim_offsets=True)
    assert ByteOffsets.of(backend) is None
    backend.post_processor = None
    backend.normalizer = normalizers.Lowercase()
    assert ByteOffsets.of(backend) is None
