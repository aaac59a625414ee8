"""The W&B sink in W&B's offline mode (its real client, writing its run file under {run}/wandb/, read back with
tests/wandb_records.py): one W&B run per Tandem run, its id derived from the run id, the config, the step metrics and
the evaluation's metrics at the last step."""

from __future__ import annotations

import re
import time
from pathlib import Path

from storage.location import Location
from tests.wandb_records import history
from tracking.sink import RunInfo
from tracking.wandb_sink import WANDB_DIR, WandbSink, wandb_id


def test_a_run_id_becomes_a_valid_wandb_id() -> None:
    assert wandb_id("20261127-120000-a1b2c3") == "20261127-120000-a1b2c3"
    assert wandb_id("my run/2") == "my-run-2"
    long = wandb_id("x" * 100)
    assert len(long) == 64 and re.fullmatch(r"[A-Za-z0-9_-]+", long) and long != wandb_id("x" * 99)


def settled_history(run_file: Path, timeout_s: float = 30.0) -> list[dict]:
    """The run file's rows once W&B's service has written them: `finish` can return while its writer still flushes the
    file on a busy machine (seen as an empty history now and then), so read until the eval row is there."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = history(run_file)
        if any("eval/loss" in row for row in rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def test_an_offline_run_holds_the_steps_and_the_eval_metrics(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = RunInfo("r-1", Location(str(tmp_path / "run")), "flow-1", None)
    sink = WandbSink("tandem-tests")
    assert sink.open(run) == 0 and sink.link is None  # offline: no page
    sink.log_params({"train.learning_rate": "0.0003"})
    sink.log_steps([{"step": s, "loss": 3.0 - s, "lr": 1e-4} for s in (1, 2)])
    sink.log_metrics({"eval/loss": 0.5}, 1)  # below W&B's current step: logged at the last one
    sink.set_tags({"tandem.spec_digest": "abc"})
    sink.close("FINISHED")
    [run_file] = (tmp_path / "run" / WANDB_DIR).rglob("*.wandb")
    rows = settled_history(run_file)
    assert [(row["_step"], row.get("train/loss")) for row in rows if "train/loss" in row] == [(1, 2.0), (2, 1.0)]
    assert [(row["_step"], row["eval/loss"]) for row in rows if "eval/loss" in row] == [(2, 0.5)]
    assert run_file.name == f"run-{wandb_id('r-1')}.wandb"  # the id a retry resumes with
