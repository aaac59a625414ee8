"""The `node` flow (flows/node.py), what a Prefect worker runs for the `prefect` backend: its parameters parsed once at
its edge, a malformed one a UserError naming the parameter (exit 2, no retry); and `python -m flows.node`, kept for
the scripts that type it, is `python -m launch.node` (tests/unit/launch/test_node.py). The flow's parameters against
what the backend sends are tests/unit/launch/backends/test_prefect.py."""

from __future__ import annotations

import runpy
import sys

import pytest

from core.errors import EXIT_USER_ERROR, UserError
from flows.node import named_phase, parsed
from launch.job import EVAL
from launch.node import node_parser
from storage.location import Location


def test_the_flows_parameters_are_parsed_once_and_a_bad_one_names_itself() -> None:
    assert named_phase("eval") is EVAL
    with pytest.raises(UserError, match=r"^phase: phase 'tune' is none of train, eval, probe$") as bad_phase:
        named_phase("tune")
    assert bad_phase.value.exit_code == EXIT_USER_ERROR
    model = parsed("model", '{"url": "s3://b/runs/r/final", "options": {"endpoint_url": "http://minio:9000"}}')
    assert model == Location("s3://b/runs/r/final") and dict(model.options) == {"endpoint_url": "http://minio:9000"}
    with pytest.raises(UserError, match=r"^model: \{: not valid JSON"):
        parsed("model", "{")


def test_python_m_flows_node_is_the_launch_entry(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["flows.node", "--help"])
    monkeypatch.delitem(sys.modules, "flows.node")  # run afresh as __main__, as `python -m` does
    with pytest.raises(SystemExit) as done:
        runpy.run_module("flows.node", run_name="__main__")
    assert done.value.code == 0
    assert capsys.readouterr().out == node_parser().format_help()
