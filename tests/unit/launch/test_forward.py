"""launch.forward_env (launch/forward.py): credentials read by name, reported only as set or missing, never by value."""

from __future__ import annotations

import pytest

from config.sections.launch import LaunchConfig
from core.errors import UserError
from launch.forward import check_forwarded, forward_env, forwarded_report

CANARY = "canary-7f3a9c2e51d04b68"


def test_forward_env_reads_values_by_name_and_reports_only_set_or_missing() -> None:
    launch = LaunchConfig(forward_env=["HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "EMPTY"])
    environ = {"HF_TOKEN": CANARY, "AWS_SECRET_ACCESS_KEY": "k" * 20, "EMPTY": "", "OTHER": "x"}
    assert forward_env(launch, environ) == {"HF_TOKEN": CANARY, "AWS_SECRET_ACCESS_KEY": "k" * 20}
    assert forwarded_report(launch, environ) == {"HF_TOKEN": "set", "AWS_SECRET_ACCESS_KEY": "set", "EMPTY": "missing"}
    with pytest.raises(UserError) as caught:
        check_forwarded(launch, 1, "gpu-07", environ)
    message = str(caught.value)
    assert message.startswith("node 1 (gpu-07): launch.forward_env names EMPTY, not set on this node")
    assert CANARY not in message and "\n" not in message
    both = LaunchConfig(forward_env=["HF_TOKEN"])
    assert check_forwarded(both, 0, "h", environ) == "HF_TOKEN set"
    assert check_forwarded(LaunchConfig(), 0, "h", environ) == "(launch.forward_env empty)"
