"""The background writer's file: its digest is that of the bytes on disk, and a full disk is raised as the OSError it
is (torch.save's own writer reports only "unexpected pos"), so that the rank's one line says what to fix. The full
disk is a real 1 MB tmpfs (root, as CI runs)."""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import pytest
import torch

from storage.digest import digest_url
from storage.location import Location
from trainer.checkpointing.writer import write_state


def test_the_digest_written_is_the_files(tmp_path: Path) -> None:
    path = tmp_path / "state.pt"
    digest, size = write_state({"w": torch.arange(1000.0)}, str(path), "blake3")
    assert (digest, size) == digest_url(Location(str(path)), "blake3")
    assert torch.equal(torch.load(path)["w"], torch.arange(1000.0))


def test_a_full_disk_is_raised_as_its_oserror(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True)
    try:
        with pytest.raises(OSError) as info:
            write_state({"w": torch.zeros(1_000_000)}, str(small / "state.pt"), "blake3")
        assert info.value.errno == errno.ENOSPC
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)
