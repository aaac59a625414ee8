"""Prefect retries: bad input is not retried. The whole pipeline, real Prefect server, real torchrun agents. (A lost
rank retried and resumed from the newest complete checkpoint: tests/flows/test_prefect_backend.py.)"""

from __future__ import annotations

import pytest

from config.loader import load_config
from core.errors import UserError

pytestmark = pytest.mark.e2e


def test_bad_input_is_not_retried(prefect_server, tmp_path, tiny_model) -> None:
    from flows.finetune import finetune

    cfg = load_config(
        None,
        [
            f"run.storage={tmp_path}",
            "run.name=not-retried",
            f"model.name_or_path={tiny_model}",
            "launch.retries=2",
            "launch.retry_delay_s=0",
            f"train.resume={tmp_path}/no-such-checkpoint",
        ],
    )
    with pytest.raises(UserError, match="not a complete checkpoint"):
        finetune(cfg)
    log = (tmp_path / "runs" / "not-retried" / "nodes" / "0" / "log.txt").read_text()
    assert log.count("not a complete checkpoint") == 1  # one attempt, not three
