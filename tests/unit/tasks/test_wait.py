"""The wait for the final checkpoint: the run's newest complete checkpoint must be the last step, else a retryable
error naming what is there and where the node logs are."""

from __future__ import annotations

import pytest
from prefect.logging import disable_run_logger

from core.errors import RetryableError
from storage.location import Location
from tasks.wait import wait_for_checkpoint
from tests.checkpoints import save_checkpoint


def test_the_final_checkpoint_is_found_or_its_absence_named(tmp_path) -> None:
    run = Location(str(tmp_path))
    with disable_run_logger():
        with pytest.raises(RetryableError, match=rf"^{tmp_path}/checkpoints: no complete checkpoint for step 8 \(none"):
            wait_for_checkpoint.fn(run, 8)
        save_checkpoint(tmp_path, 4)
        save_checkpoint(tmp_path, 8, seal=False)
        with pytest.raises(
            RetryableError, match=rf"\(newest complete is step 4\); see the node logs under {tmp_path}/no"
        ):
            wait_for_checkpoint.fn(run, 8)
        save_checkpoint(tmp_path, 12)
        with pytest.raises(RetryableError, match=r"\(newest complete is step 12\)"):
            wait_for_checkpoint.fn(run, 8)  # a later step than this run's last: another run's
        assert wait_for_checkpoint.fn(run, 12).step == 12
