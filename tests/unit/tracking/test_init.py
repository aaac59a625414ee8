"""What every tracking sink records besides metrics: the resolved config as flat, masked params, and the lineage and
an elastic run's attempts as tags (tasks/track.py), and the check before a run that its sinks are installed."""

from __future__ import annotations

import json

from storage.spec import Attempt
from tests.specs import spec_for
from tracking import resolved_params, run_tags
from tracking.sink import flatten


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


def test_a_tracking_extra_that_is_not_installed_is_named_in_one_line(tmp_path) -> None:
    """The pipeline's check before training, in a process where `import mlflow` fails as it does without the
    extra (a None entry in sys.modules is how Python marks a module as not importable)."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = (
        "import sys; sys.modules['mlflow'] = None\n"
        "from config.loader import load_config\nfrom tracking import check_tracking\n"
        "check_tracking(load_config(None, ['track.mlflow_uri=http://127.0.0.1:1']))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert (
        "core.errors.UserError: track.mlflow_uri: MLflow is not installed in this environment: "
        "pip install 'tandem[mlflow]' (or set track.mlflow_uri=off)"
    ) in done.stderr
