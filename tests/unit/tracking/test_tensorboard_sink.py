"""The TensorBoard sink: scalar and text events of one run under {run}/tensorboard/, read back with TensorBoard's own
event reader; a retry opens a new event file beside the old one and resumes after the last step; on an object store
the events are written locally and uploaded at the end (a real S3 endpoint on 127.0.0.1)."""

from __future__ import annotations

from pathlib import Path

from storage.fs import listdir
from storage.location import Location, join
from tracking.sink import RunInfo
from tracking.tensorboard_sink import EVENTS_PREFIX, TensorBoardSink, last_event_step

STEPS = [{"step": s, "loss": 3.0 - s / 10, "lr": 1e-4, "grad_norm": 0.5} for s in (1, 2, 3)]


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder))
    accumulator.Reload()
    return {
        tag: [(e.step, round(e.value, 4)) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]
    }


def record(sink: TensorBoardSink, run: RunInfo, steps: list[dict], status: str) -> int:
    last = sink.open(run)
    sink.log_params({"train.learning_rate": "0.0003"})
    sink.log_steps(steps)
    sink.set_tags({"tandem.spec_digest": "abc"})
    sink.close(status)
    return last


def test_steps_and_metrics_are_events_a_retry_resumes_after(tmp_path) -> None:
    run = RunInfo("r", Location(str(tmp_path / "run")), None, None)
    assert record(TensorBoardSink(), run, STEPS[:2], "FAILED") == 0
    retry = TensorBoardSink()
    assert retry.open(run) == 2
    retry.log_steps(STEPS[2:])
    retry.log_metrics({"eval/loss": 2.5}, 3)
    retry.close("FINISHED")
    folder = tmp_path / "run" / "tensorboard"
    assert len(list(folder.glob(f"{EVENTS_PREFIX}*"))) == 2 and last_event_step(folder) == 3
    found = scalars(folder)
    assert found["train/loss"] == [(1, 2.9), (2, 2.8), (3, 2.7)] and found["eval/loss"] == [(3, 2.5)]
    assert [step for step, _ in found["train/grad_norm"]] == [1, 2, 3]


def test_on_an_object_store_the_events_are_uploaded_at_the_end(s3_bucket, tmp_path) -> None:
    run_url = join(s3_bucket, "runs/r")
    run = RunInfo("r", run_url, None, None)
    record(TensorBoardSink(), run, STEPS[:2], "FAILED")
    uploaded = [name for name in listdir(join(run_url, "tensorboard")) if name.startswith(EVENTS_PREFIX)]
    assert len(uploaded) == 1
    retry = TensorBoardSink()
    assert retry.open(run) == 2  # the uploaded events are fetched back first
    retry.close("FINISHED")
    assert len(listdir(join(run_url, "tensorboard"))) == 2
