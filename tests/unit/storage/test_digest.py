"""File digests for manifests: BLAKE3 or SHA-256, of bytes in memory and of files at any URL, the same either way."""

from __future__ import annotations

import hashlib

import blake3
import pytest

from storage.digest import CHUNK, digest_bytes, digest_url, hasher
from storage.location import Location


@pytest.mark.parametrize("algorithm", ["blake3", "sha256"])
def test_a_file_read_in_chunks_digests_as_its_bytes(tmp_path, algorithm: str) -> None:
    body = bytes(range(256)) * (CHUNK // 256 + 3)  # more than one chunk
    (tmp_path / "f").write_bytes(body)
    expected = blake3.blake3(body).hexdigest() if algorithm == "blake3" else hashlib.sha256(body).hexdigest()
    assert digest_bytes(body, algorithm) == expected
    assert digest_url(Location(str(tmp_path / "f")), algorithm) == (expected, len(body))


def test_the_serial_hasher_agrees_and_an_unknown_algorithm_is_named() -> None:
    one = hasher("blake3", parallel=False)
    one.update(b"x" * 1000)
    assert one.hexdigest() == digest_bytes(b"x" * 1000, "blake3")
    with pytest.raises(ValueError, match=r"digest algorithm must be one of \('blake3', 'sha256'\), got 'md5'"):
        hasher("md5")
