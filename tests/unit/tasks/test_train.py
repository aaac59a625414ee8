"""The train task's own logic: a run already trained to its last step launches nothing; only retryable failures are
retried; progress is logged with its ETA, shown as a Prefect progress artifact (the session's Prefect server) and
handed to the run's tracker."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect.states import Completed, Failed

from core.errors import RetryableError, UserError
from storage import layout
from storage.checkpoints import model_manifest
from storage.location import Location
from tasks.train import progress_reporter, retry_only_retryable, trained_to_the_end
from tests.checkpoints import save_checkpoint
from tests.specs import spec_for
from tracking.sink import RunInfo, Tracker
from tracking.tensorboard_sink import TensorBoardSink, last_event_step
from trainer.checkpointing.deepspeed_io import publish_dir

STEP = {"loss": 1.5, "tokens": 100, "tokens_per_s": 250.0}


def test_a_run_trained_to_its_last_step_with_its_export_launches_nothing(tmp_path) -> None:
    spec = spec_for(tmp_path, [])  # 8 steps, runs/r
    run = tmp_path / "runs" / "r"
    save_checkpoint(run, 8)
    assert not trained_to_the_end(spec)  # no export yet
    staging = tmp_path / "export"
    staging.mkdir()
    (staging / "adapter_model.safetensors").write_bytes(b"weights")
    publish_dir(str(staging), layout.final_dir(spec.run), "blake3", lambda files: model_manifest(8, "blake3", files))
    assert trained_to_the_end(spec)
    never = spec.model_copy(
        update={
            "config": spec.config.model_copy(update={"train": spec.config.train.model_copy(update={"resume": "never"})})
        }
    )
    assert not trained_to_the_end(never)
    (Path(str(layout.final_dir(spec.run))) / "adapter_model.safetensors").write_bytes(b"WEIGHTS")
    assert not trained_to_the_end(spec)  # an export that is not whole trains again


@pytest.mark.parametrize(
    ("state", "retried"),
    [
        (Failed(data=RetryableError("node 1 lost")), True),
        (Failed(data=UserError("bad data")), False),
        (Failed(data=ValueError("a bug")), False),
        (Completed(), False),
    ],
)
def test_only_retryable_failures_are_retried(state, retried: bool) -> None:
    assert retry_only_retryable(None, None, state) is retried


def test_progress_is_logged_shown_and_tracked(prefect_server, tmp_path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    lines: list[str] = []
    tracker = Tracker([TensorBoardSink()], RunInfo("r", Location(str(tmp_path / "run")), None, None))
    report = progress_reporter(4, lines.append, tracker)
    report({**STEP, "step": 1})
    report({**STEP, "step": 2})
    assert lines[0].startswith("step 1/4 loss 1.5000 tokens 100 tokens/s 250 ETA ") and lines[1].startswith("step 2/4")
    with get_client(sync_client=True) as client:
        [artifact] = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["training-progress"])),
            sort=ArtifactSort.CREATED_DESC,
            limit=1,
        )
    assert float(artifact.data) == 50.0
    assert tracker.close("FINISHED", 30) == []
    assert last_event_step(tmp_path / "run" / "tensorboard") == 2  # both steps reached the run's tracking


def test_online_rls_progress_line_has_its_reward_and_the_generations_share() -> None:
    from tasks.train import progress_line

    record = {"step": 3, "loss": 0.0, "tokens": 2216, "tokens_per_s": 2000.0, "reward": 0.6532, "generation_s": 0.96,
              "step_time_s": 2.0}  # fmt: skip
    assert progress_line(record, 40, 83.0) == (
        "step 3/40 loss 0.0000 tokens 2216 tokens/s 2000 reward 0.6532 generation 48% of the step ETA 83 s"
    )
