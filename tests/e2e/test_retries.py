"""Prefect retries: a lost rank is retried and the retry resumes from the newest complete checkpoint;
bad input is not retried. The whole pipeline, real Prefect server, real torchrun agents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from config.errors import UserError
from config.loader import load_config

pytestmark = pytest.mark.e2e


def test_a_lost_rank_is_retried_and_resumes(prefect_server, tmp_path, tiny_model) -> None:
    from flows.finetune import finetune

    marker = tmp_path / "died-once"
    cfg = load_config(None, [f"run.storage={tmp_path}", "run.name=retried", f"model.name_or_path={tiny_model}",
                             "launch.retries=1", "launch.retry_delay_s=0",
                             "train.max_steps=6", "train.save_steps=2",
                             f"launch.env={{TANDEM_TEST_EXIT_AT_STEP: '1:4', TANDEM_TEST_EXIT_ONCE: '{marker}'}}"])
    summary = finetune(cfg)
    assert marker.exists()  # rank 1 really died once
    log = (tmp_path / "runs" / "retried" / "nodes" / "0" / "log.txt").read_text()
    assert "resumed from step 2" in log
    steps = [json.loads(line)["step"] for line in (Path(summary["run_url"]) / "metrics.jsonl").read_text().splitlines()
             if "event" not in line]
    assert steps == [1, 2, 3, 4, 5, 6]  # one uninterrupted trajectory
    assert summary["registered"] and summary["registration"].startswith("tandem-tiny v")


def test_bad_input_is_not_retried(prefect_server, tmp_path, tiny_model) -> None:
    from flows.finetune import finetune

    cfg = load_config(None, [f"run.storage={tmp_path}", "run.name=not-retried", f"model.name_or_path={tiny_model}",
                             "launch.retries=2",
                             "launch.retry_delay_s=0", f"train.resume={tmp_path}/no-such-checkpoint"])
    with pytest.raises(UserError, match="not a complete checkpoint"):
        finetune(cfg)
    log = (tmp_path / "runs" / "not-retried" / "nodes" / "0" / "log.txt").read_text()
    assert log.count("not a complete checkpoint") == 1  # one attempt, not three
