"""Shared fixtures. Local state goes to a per-session temporary folder, never the user's ~/.prefect."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".tandem" / "torch_extensions"))


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[None]:
    """One real Prefect server (Prefect's test harness) for the whole session."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=60), temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


def run_cli(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: int = 600):
    """Run `python -m ...` as a user would; returns the CompletedProcess."""
    import subprocess

    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="session")
def staged(tmp_path_factory):
    """The tiny model and the sample data, staged once for every test that runs real ranks."""
    from tests.distributed.harness import stage

    return stage(tmp_path_factory.mktemp("dist-storage"))
