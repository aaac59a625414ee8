"""`python -m flows.submit`: the parameters it sends, and its one-line errors (no server needed for these)."""

from __future__ import annotations

import pytest

from config.schema import FinetuneConfig
from core.errors import UserError
from flows.submit import build_parameters
from tests.conftest import run_cli


def test_parameters_are_the_validated_config_with_paths_as_written() -> None:
    parameters = build_parameters("tiny-cpu", ["train.max_steps=7", "run.storage=s3://tandem/tandem"])
    config = FinetuneConfig.model_validate(parameters["config"])
    assert config.train.max_steps == 7 and config.run.storage == "s3://tandem/tandem"
    # Relative paths are resolved by the worker against its own checkout, not here.
    assert (config.data.source, config.deepspeed.config) == (
        "data/sample/conversations.json",
        "config/deepspeed/zero2.json",
    )


def test_a_bad_value_is_refused_before_any_server_is_asked() -> None:
    with pytest.raises(
        UserError,
        match=r"^config tiny-cpu.yaml with --set: train.method: Input should be 'full', "
        r"'lora' or 'qlora' \(got 'bogus'\)$",
    ):
        build_parameters(None, ["train.method=bogus"])


def test_cli_error_is_one_line_with_exit_2() -> None:
    result = run_cli("flows.submit", "finetune/manual", "--set", "launch.nnodes=0", timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: config tiny-cpu.yaml with --set: launch.nnodes: Input should be greater than 0 (got 0)"
    ]
