"""Preflight's space check: what the run will write against the free space where it writes, per filesystem; a
shortfall stops the node in one line (exit 2) naming the place, the free and the needed bytes, or is a warning with
launch.require_space=false; a model the estimate does not know is no estimate, not a guess."""

from __future__ import annotations

import json

import pytest

from core.errors import EXIT_USER_ERROR
from launch.job import NodePlan
from launch.space import check_space, needs, run_footprint
from storage.full import StorageFull
from tests.published import QWEN25_05B_INSTRUCT
from tests.specs import spec_for

PLAN = NodePlan(0, 2, 1, "127.0.0.1", 29500)


def spec_with_model(tmp_path, layers: int, *overrides: str):
    """A full fine-tuning run of Qwen2.5-0.5B's shape with `layers` layers (a model's config.json is all it reads)."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({**QWEN25_05B_INSTRUCT, "num_hidden_layers": layers}))
    return spec_for(tmp_path, ["train.method=full", *overrides]).model_copy(update={"model_path": str(model)})


def test_a_run_that_fits_reports_the_free_and_the_needed_bytes(tmp_path) -> None:
    report = check_space(spec_with_model(tmp_path, 2), PLAN, bf16=True)
    assert report.count(";") == 0 and " free, " in report and report.endswith(" needed")


def test_a_shortfall_is_one_line_or_a_warning_when_space_is_not_required(tmp_path, caplog) -> None:
    huge = spec_with_model(tmp_path, 200_000)  # trillions of parameters: no disk has their checkpoints' room
    with pytest.raises(StorageFull) as info:
        check_space(huge, PLAN, bf16=True)
    message = str(info.value)
    assert message.startswith("node 0: not enough space on ") and "\n" not in message
    assert "lower train.keep_latest_k, or point run.storage at a larger store" in message
    assert info.value.exit_code == EXIT_USER_ERROR
    allowed = spec_with_model(tmp_path, 200_000, "launch.require_space=false")
    with caplog.at_level("WARNING", logger="launch.space"):
        assert check_space(allowed, PLAN, bf16=True).endswith("(short: launch.require_space=false)")
    assert any("not enough space" in record.getMessage() for record in caplog.records)


def test_an_object_store_run_also_stages_each_ranks_shards_on_the_node(tmp_path) -> None:
    spec = spec_with_model(tmp_path, 2, "run.storage=s3://bucket/tandem")
    footprint = run_footprint(spec, bf16=True)
    assert footprint is not None
    places = [need.place for need in needs(spec, PLAN, footprint)]
    assert str(places[0]) == "s3://bucket/tandem/runs/r" and len(places) == 2  # the dataset here is local: no copy
    assert "no estimate" in check_space(spec_for(tmp_path, []), PLAN, bf16=True)  # spec_for's model: no config.json
