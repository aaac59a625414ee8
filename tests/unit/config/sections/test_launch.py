"""The `launch` section's checks: each a one-line error naming the key."""

from __future__ import annotations

import pytest

from config.loader import load_config
from core.errors import UserError


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["launch.forward_env=[HF_TOKEN, 9LIVES]"], "launch.forward_env: '9LIVES' is not an environment variable name"),
        (["launch.forward_env=[HF_TOKEN, HF_TOKEN]"], "launch.forward_env: HF_TOKEN is listed twice"),
        (
            ["launch.forward_env=[NCCL_DEBUG]", "launch.env.NCCL_DEBUG=INFO"],
            "launch.env.NCCL_DEBUG is also in launch.forward_env; keep it in one place",
        ),
    ],
)
def test_bad_forwarded_names_are_refused(overrides: list[str], expected: str) -> None:
    with pytest.raises(UserError, match=expected):
        load_config(None, overrides)
