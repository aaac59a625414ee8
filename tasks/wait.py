"""Wait for the final checkpoint: the run's newest complete checkpoint must be the last step."""

from __future__ import annotations

from prefect import get_run_logger, task

from core.errors import RetryableError
from storage import layout
from storage.checkpoints import CompleteCheckpoint, latest_complete
from storage.location import Location


@task(name="wait-for-complete")
def wait_for_checkpoint(run_url: Location, expected_step: int) -> CompleteCheckpoint:
    """The final checkpoint, checked against its manifest; fails when training left none."""
    found = latest_complete(run_url)
    if found is None or found.step != expected_step:
        have = f"newest complete is step {found.step}" if found else "none is complete"
        raise RetryableError(
            f"{layout.checkpoints_dir(run_url)}: no complete checkpoint for step {expected_step} "
            f"({have}); see the node logs under {run_url}/nodes"
        )
    get_run_logger().info("checkpoint step %d complete (manifest %s)", found.step, found.manifest_digest[:12])
    return found
