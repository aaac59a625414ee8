"""Which checkpoints exist for readers: only those whose COMPLETE matches their manifest.

Shared by the trainer (resume, retention) and the flow (wait, evaluate, register), so both sides
apply the same rule (DESIGN.md: "A directory without COMPLETE does not exist for readers").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from storage import layout
from config.errors import UserError
from storage.manifest import read_manifest, verify_files
from storage.fs import exists, join, listdir, read_bytes

STEP_PREFIX = "step-"


@dataclass(frozen=True)
class CompleteCheckpoint:
    """A checkpoint whose COMPLETE marker matches its manifest."""

    url: str
    step: int
    manifest_digest: str
    manifest: dict[str, Any]


def step_of(name: str) -> int | None:
    """The step number of a `step-00000100` directory name, else None."""
    digits = name.removeprefix(STEP_PREFIX)
    return int(digits) if name.startswith(STEP_PREFIX) and digits.isdigit() else None


def inspect(url: str) -> CompleteCheckpoint | str:
    """The checkpoint at `url` if its COMPLETE matches its manifest and every file has its size; otherwise
    why not, in one line naming the file."""
    complete, manifest_url = join(url, layout.COMPLETE), join(url, layout.MANIFEST)
    if not exists(complete):
        return f"{complete}: missing (the save did not finish)"
    try:
        manifest, digest = read_manifest(url, layout.CHECKPOINT_SCHEMA)
        recorded = read_bytes(complete).decode(errors="replace").strip()
        if recorded != digest:
            return (f"{manifest_url}: digest {digest} is not the {recorded!r} that {complete} records; the "
                    "manifest or its marker changed after the save")
        verify_files(url, manifest, mode="size")
        return CompleteCheckpoint(url, int(manifest["step"]), digest, manifest)
    except UserError as exc:
        return str(exc)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # bytes that are not our JSON any more
        return f"{manifest_url}: unreadable ({type(exc).__name__}: {exc})"


def read_complete(url: str) -> CompleteCheckpoint | None:
    """The checkpoint at `url` if its COMPLETE matches its manifest and every file has its size."""
    found = inspect(url)
    return found if isinstance(found, CompleteCheckpoint) else None


def step_dirs(run_url: str) -> list[tuple[int, str]]:
    """(step, URL) of every step directory of a run, complete or not, newest first."""
    root = layout.checkpoints_dir(run_url)
    found = [(step, join(root, name)) for name in listdir(root) if (step := step_of(name)) is not None]
    return sorted(found, reverse=True)


def complete_checkpoints(run_url: str) -> list[CompleteCheckpoint]:
    """Every complete checkpoint of a run, newest first."""
    return [ckpt for _, url in step_dirs(run_url) if (ckpt := read_complete(url)) is not None]


def latest_complete(run_url: str) -> CompleteCheckpoint | None:
    """The newest complete checkpoint of a run, or None."""
    for _, url in step_dirs(run_url):
        ckpt = read_complete(url)
        if ckpt is not None:
            return ckpt
    return None
