"""Writes that must not race, on local storage and on a real S3 endpoint (moto's server on 127.0.0.1): an exclusive
create never overwrites, and a compare-and-swap refuses a stale token."""

from __future__ import annotations

from storage.conditional import create_exclusive, read_versioned, replace_if_unchanged
from storage.fs import read_bytes
from storage.location import join


def test_create_exclusive_never_overwrites(storage) -> None:
    url = join(storage, "claims/one.json")
    assert create_exclusive(url, b"first")
    assert not create_exclusive(url, b"second")
    assert read_bytes(url) == b"first"


def test_compare_and_swap_refuses_a_stale_token(storage) -> None:
    url = join(storage, "alias.json")
    assert read_versioned(url) == (None, None)
    assert replace_if_unchanged(url, b"a", None)
    assert not replace_if_unchanged(url, b"b", None)  # "only if absent" after someone created it
    data, token = read_versioned(url)
    assert data == b"a"
    assert replace_if_unchanged(url, b"c", token)
    assert not replace_if_unchanged(url, b"d", token)  # the token went stale with the write of "c"
    assert read_versioned(url)[0] == b"c"
