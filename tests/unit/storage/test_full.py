"""A full store is one line: storage/fs.py turns ENOSPC (and EDQUOT) of every write into StorageFull, exit 2, naming
the store, the file, the free and the needed bytes, and leaves no temporary file and no changed file behind. A real
full filesystem (a small tmpfs), not a mocked errno."""

from __future__ import annotations

import errno
import os

import pytest

from core.errors import EXIT_USER_ERROR
from storage.conditional import create_exclusive
from storage.fs import write_bytes_atomic
from storage.full import StorageFull, storage_full
from storage.location import Location
from tests.tmpfs import NEEDS_ROOT, mounted

pytestmark = NEEDS_ROOT


def test_a_write_that_does_not_fit_is_one_line_and_changes_nothing(tmp_path) -> None:
    with mounted(tmp_path / "full", "256k") as store:
        target = store / "runs" / "r" / "status.json"
        write_bytes_atomic(Location(str(target)), b"old")
        with pytest.raises(StorageFull) as caught:
            write_bytes_atomic(Location(str(target)), b"x" * 600_000)
        message = str(caught.value)
        assert caught.value.exit_code == EXIT_USER_ERROR
        assert "\n" not in message
        assert message.startswith(f"storage full: {store} (")
        assert f"while writing {target}" in message
        assert "600.0 KB needed" in message and " free, " in message
        assert "train.keep_latest_k" in message
        assert target.read_bytes() == b"old"  # the old file stands
        assert [p.name for p in target.parent.iterdir()] == ["status.json"]  # no temporary file left


def test_an_exclusive_create_that_does_not_fit_is_one_line(tmp_path) -> None:
    with mounted(tmp_path / "full", "256k") as store:
        entry = store / "registry" / "m" / "v0001.json"
        with pytest.raises(StorageFull, match=rf"while writing {entry}; "):
            create_exclusive(Location(str(entry)), b"x" * 600_000)
        assert not entry.exists()
        assert list(entry.parent.iterdir()) == []


def test_other_errors_are_not_called_full() -> None:
    assert storage_full(PermissionError(errno.EACCES, "Permission denied", "/x")) is None
    assert storage_full(RuntimeError("boom")) is None
    quota = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/nowhere/f")
    wrapped = RuntimeError("wrapped")
    wrapped.__cause__ = quota
    assert isinstance(storage_full(wrapped, "/"), StorageFull)
