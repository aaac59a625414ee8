"""What every tracking sink records besides metrics: the resolved config as flat, masked params, and the lineage and
an elastic run's attempts as tags (tasks/tracking)."""

from __future__ import annotations

import json

from storage.spec import Attempt
from tests.unit.test_elastic_config import spec_for
from tracking import resolved_params, run_tags
from tracking.sink import flatten, step_metrics


def test_the_resolved_config_is_flattened_with_secret_looking_values_masked(tmp_path) -> None:
    params = resolved_params(spec_for(tmp_path, ["launch.nnodes=3"]))
    assert params["train.global_batch_size"] == "12" and params["launch.nnodes"] == "3"
    assert params["resolved.world_size"] == "3" and params["resolved.total_steps"] == "8"
    assert params["resolved.dataset_id"] == "d"
    assert params["resolved.deepspeed.train_batch_size"] == "12"  # DeepSpeed's "auto" filled in
    assert flatten({"hub": {"api_key": "hf_abcdefghijklmnop", "repo": "me/model"}, "empty": {}}) == {
        "hub.api_key": "***",
        "hub.repo": "me/model",
        "empty": "{}",
    }


def test_an_elastic_runs_attempts_and_the_lineage_become_tags(tmp_path) -> None:
    attempts = [
        Attempt(number=1, nodes=[0, 1, 2], world_size=3, from_step=0),
        Attempt(number=2, nodes=[0, 2], world_size=2, from_step=4, left_out={"1": "unreachable"}),
    ]
    spec = spec_for(tmp_path, ["launch.nnodes=3", "launch.min_nnodes=2"]).model_copy(update={"attempts": attempts})
    tags = run_tags(spec, {"spec_digest": "abc", "flow_run_id": None, "attempts": ["ignored"]})
    assert tags["tandem.spec_digest"] == "abc" and "tandem.flow_run_id" not in tags
    assert tags["tandem.attempts"] == "2"
    assert json.loads(tags["tandem.attempt_history"])[1] == {
        "number": 2,
        "nodes": [0, 2],
        "world_size": 2,
        "from_step": 4,
        "left_out": {"1": "unreachable"},
    }


def test_a_step_line_gives_its_train_metrics_and_skips_what_is_missing() -> None:
    line = {"step": 3, "max_steps": 8, "loss": 2.5, "lr": 0.001, "grad_norm": None, "tokens_per_s": 100}
    assert step_metrics(line) == {"train/loss": 2.5, "train/lr": 0.001, "train/tokens_per_s": 100.0}
