"""A small tmpfs mounted for one test, as a store that fills up (root only: `mount -t tmpfs`)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")


@contextlib.contextmanager
def mounted(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's syntax: 2m, 512k) at `path`, unmounted (and its files gone) afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
