"""`python -m flows.submit`'s parameters: the preset with the --set overrides, validated here as the server would,
paths left as written (a worker resolves them against its own checkout)."""

from __future__ import annotations

import pytest

from core.errors import UserError
from flows.submit import build_parameters


def test_the_parameters_are_the_validated_config_with_paths_as_written() -> None:
    parameters = build_parameters("tiny-cpu", ["train.max_steps=7", "data.source=data/sample/conversations.json"])
    config = parameters["config"]
    assert config["train"]["max_steps"] == 7 and config["data"]["source"] == "data/sample/conversations.json"
    assert config["deepspeed"]["config"] == "config/deepspeed/zero2.json"  # not made absolute here


def test_a_bad_value_is_one_line_naming_it() -> None:
    with pytest.raises(UserError, match=r"^config tiny-cpu.yaml with --set: train.max_steps: Input should be greater"):
        build_parameters(None, ["train.max_steps=0"])
