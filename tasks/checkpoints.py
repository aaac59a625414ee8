"""Find and check complete checkpoints: a directory without a consistent COMPLETE does not exist."""

from __future__ import annotations

from dataclasses import dataclass

from prefect import get_run_logger, task

from config import layout
from config.errors import RetryableError
from config.manifest import read_manifest, verify_files
from config.storage import exists, join, listdir, read_bytes


@dataclass(frozen=True)
class CompleteCheckpoint:
    """A checkpoint whose COMPLETE marker matches its manifest."""

    url: str
    step: int
    manifest_digest: str


def is_complete(url: str) -> str | None:
    """The manifest digest if `url` holds a COMPLETE matching its manifest and every file's size."""
    if not exists(join(url, layout.COMPLETE)):
        return None
    manifest, digest = read_manifest(url, layout.CHECKPOINT_SCHEMA)
    if read_bytes(join(url, layout.COMPLETE)).decode().strip() != digest:
        return None
    verify_files(url, manifest, mode="size")
    return digest


def latest_complete(run_url: str) -> CompleteCheckpoint | None:
    """The newest complete checkpoint of a run, or None."""
    root = layout.checkpoints_dir(run_url)
    for name in sorted((n for n in listdir(root) if n.startswith("step-")), reverse=True):
        url = join(root, name)
        digest = is_complete(url)
        if digest:
            return CompleteCheckpoint(url, int(name.removeprefix("step-")), digest)
    return None


@task(name="wait-for-complete")
def wait_for_checkpoint(run_url: str, expected_step: int) -> CompleteCheckpoint:
    """The final checkpoint, checked against its manifest; fails when training left none."""
    found = latest_complete(run_url)
    if found is None or found.step != expected_step:
        have = f"newest complete is step {found.step}" if found else "none is complete"
        raise RetryableError(f"{layout.checkpoints_dir(run_url)}: no complete checkpoint for step {expected_step} "
                             f"({have}); see the node logs under {run_url}/nodes")
    get_run_logger().info("checkpoint step %d complete (manifest %s)", found.step, found.manifest_digest[:12])
    return found
