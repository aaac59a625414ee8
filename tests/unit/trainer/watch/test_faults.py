"""The test-only faults, a value read once from the environment (`Faults.from_environment`): none set is the no-op
value production runs with; each hook fires on its rank at its step only; an exit is a hard one (137, like a SIGKILL)
that EXIT_ONCE lets happen once, so that a retry succeeds; a signal hook dies by that signal."""

from __future__ import annotations

import hashlib
import math
import signal
import subprocess
import sys

import pytest
import torch

from storage.location import Location
from tests.conftest import ROOT
from trainer.watch.faults import NO_FAULTS, At, Faults, SavePoint


def test_no_variable_set_is_the_production_value_whose_hooks_do_nothing() -> None:
    faults = Faults.from_environment({"PATH": "/usr/bin", "TANDEM_HEARTBEAT_DIR": "/h"})
    assert faults is NO_FAULTS
    loss = torch.tensor(2.0)
    assert not faults.fires_at(0, 1) and faults.poison(loss, 0, 1) is loss
    faults.at_step(0, 1)
    faults.in_micro_batch(0, 1)
    faults.in_save(0, 1, SavePoint.AFTER_SHARD)


def test_a_step_hook_fires_on_its_rank_at_its_step_only() -> None:
    env = {"TANDEM_TEST_NAN_AT_STEP": "1:3", "TANDEM_TEST_OOM_AT_STEP": "0:5", "TANDEM_TEST_RAISE_AT_STEP": "1:6"}
    faults = Faults.from_environment(env)
    assert faults.nan_at == At(1, 3.0)
    loss = torch.tensor(2.0)
    assert faults.fires_at(1, 3) and not faults.fires_at(0, 3) and not faults.fires_at(1, 4)
    assert math.isnan(faults.poison(loss, 1, 3).item()) and faults.poison(loss, 0, 3).item() == 2.0
    with pytest.raises(torch.OutOfMemoryError, match="injected by TANDEM_TEST_OOM_AT_STEP"):
        faults.poison(loss, 0, 5)
    with pytest.raises(ValueError, match="injected by TANDEM_TEST_RAISE_AT_STEP at step 6"):
        faults.poison(loss, 1, 6)


def test_a_save_point_that_is_not_one_is_named_when_the_faults_are_read() -> None:
    with pytest.raises(ValueError, match="POINT must be one of mid_upload, after_shard, before_complete"):
        Faults.from_environment({"TANDEM_TEST_EXIT_IN_SAVE": "0:2:halfway"})


def test_the_environment_is_read_once_not_at_each_hook(monkeypatch) -> None:
    """A variable set after the value was read changes nothing: no hook reads the environment."""
    faults = Faults.from_environment({})
    monkeypatch.setenv("TANDEM_TEST_RAISE_AT_STEP", "0:1")
    loss = torch.tensor(1.0)
    assert faults.poison(loss, 0, 1) is loss and not faults.fires_at(0, 1)


EXIT = """
import os
from trainer.watch.faults import Faults
faults = Faults.from_environment(os.environ)
for step in range(1, 5):
    faults.at_step(0, step)
print('lived')
"""


def test_an_exit_is_hard_and_exit_once_lets_the_retry_live(tmp_path) -> None:
    once, stamp = tmp_path / "once", tmp_path / "stamp"
    env = {
        "TANDEM_TEST_EXIT_AT_STEP": "0:3",
        "TANDEM_TEST_EXIT_ONCE": str(once),
        "TANDEM_TEST_EXIT_STAMP": str(stamp),
        "PATH": "/usr/bin:/bin",
    }
    first = subprocess.run([sys.executable, "-c", EXIT], cwd=ROOT, env=env, capture_output=True, text=True)
    assert first.returncode == 137 and first.stdout == "" and once.exists() and float(stamp.read_text()) > 0
    retry = subprocess.run([sys.executable, "-c", EXIT], cwd=ROOT, env=env, capture_output=True, text=True)
    assert retry.returncode == 0 and retry.stdout == "lived\n"


@pytest.mark.parametrize("name", ["KILL", "SEGV", "BUS", "ABRT"])
def test_a_signal_hook_kills_the_process_with_that_signal(name: str) -> None:
    """A real death by signal, faulthandler on (as in a rank): the process ends by the signal, not by an exit."""
    env = {"TANDEM_TEST_SIGNAL_AT_STEP": "0:2", "PATH": "/usr/bin:/bin"} | (
        {"TANDEM_TEST_SIGNAL": name} if name != "KILL" else {}
    )
    code = "import faulthandler\nfaulthandler.enable()\n" + EXIT
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == -getattr(signal, f"SIG{name}") and done.stdout == "", done.stderr


def test_the_environment_digest_proves_a_value_arrived_without_storing_it(tmp_path, monkeypatch) -> None:
    faults = Faults.from_environment({"TANDEM_TEST_ENV_DIGEST": "HF_TOKEN"})
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    faults.record_env_digest(Location(str(tmp_path)), 1, 3)
    written = (tmp_path / "nodes" / "1" / "env-digest-rank-00003.txt").read_text()
    assert written == hashlib.sha256(b"hf_secret_value").hexdigest()
    monkeypatch.delenv("HF_TOKEN")
    faults.record_env_digest(Location(str(tmp_path)), 1, 3)
    assert (tmp_path / "nodes" / "1" / "env-digest-rank-00003.txt").read_text() == "missing"
