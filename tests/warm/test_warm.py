"""Warm starts (tests/warm/): a process started as `python -m MODULE` for an agent or a rank runs in a worker forked
from the warm zygote, and looks from its parent exactly like a cold one: the same output, exit code, death by signal,
signals forwarded, and gone when its client is killed; a training run computes the same losses warm and cold."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT


def wait_warm(zygote: subprocess.Popen | None) -> None:
    """Until the zygote listens (it starts in the background with the session)."""
    if zygote is None:
        pytest.skip("warm starts are off in this session (TANDEM_COLD_START=1)")
    path = Path(os.environ["TANDEM_WARM_SOCKET"])
    deadline = time.monotonic() + 180
    while not path.exists():
        assert zygote.poll() is None and time.monotonic() < deadline, "the warm zygote did not start"
        time.sleep(0.2)


def workers_of(zygote: subprocess.Popen) -> list[int]:
    """The zygote's live children (its workers)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == zygote.pid and "Z" not in stat.split()[2]:
                pids.append(int(entry))
    return pids


def sleepers() -> set[int]:
    """Pids of the `sleep 60` processes the agents below start."""
    found = subprocess.run(["pgrep", "-f", "^sleep 60$"], capture_output=True, text=True, check=False).stdout
    return {int(pid) for pid in found.split()}


def started_sleeper(before: set[int]) -> set[int]:
    """Poll until an agent has started its `sleep 60` (at most a minute)."""
    deadline = time.monotonic() + 60
    while not sleepers() - before:
        assert time.monotonic() < deadline, "the agent never started its worker"
        time.sleep(0.1)
    return sleepers() - before


def run(args: list[str], *, warm: bool, **kwargs) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if not warm:
        env.pop("TANDEM_WARM_SOCKET")
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, **kwargs)


@pytest.mark.parametrize("args", [["-m", "trainer", "--help"], ["-u", "-m", "trainer", "--spec", "{not json"]])
def test_a_warm_process_prints_and_exits_as_a_cold_one(warm_start, args: list[str]) -> None:
    wait_warm(warm_start)
    warm, cold = run(args, warm=True, timeout=120), run(args, warm=False, timeout=120)
    assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr)
    assert warm.returncode in (0, 2) and (warm.stdout or warm.stderr)


def test_signals_reach_the_worker_and_its_death_is_the_clients(warm_start, tmp_path) -> None:
    """torchrun's agent, warm, around a command that sleeps: SIGTERM to the client ends the agent as it ends a cold one;
    SIGKILL to the client leaves no worker behind."""
    wait_warm(warm_start)
    agent = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=1", "--no-python"]
    outcomes = []
    for warm in (True, False):
        env = dict(os.environ) if warm else {k: v for k, v in os.environ.items() if k != "TANDEM_WARM_SOCKET"}
        env["TORCHELASTIC_ERROR_FILE"] = str(tmp_path / f"error-{warm}.json")
        before = sleepers()
        process = subprocess.Popen([*agent, "sleep", "60"], cwd=ROOT, env=env, start_new_session=True)
        started_sleeper(before)
        process.send_signal(signal.SIGTERM)
        outcomes.append(process.wait(timeout=60))
    assert outcomes[0] == outcomes[1] != 0  # torchrun's own answer to SIGTERM, warm or cold
    previous = sleepers()
    process = subprocess.Popen([*agent, "sleep", "60"], cwd=ROOT, start_new_session=True)
    orphan = started_sleeper(previous)
    before = workers_of(warm_start)
    assert before, "the agent runs in a worker of the zygote"
    process.kill()
    assert process.wait(timeout=30) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while set(before) & set(workers_of(warm_start)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not set(before) & set(workers_of(warm_start)), "a worker outlived its client"
    for pid in orphan:  # the agent's own child, orphaned as it would be cold
        os.kill(pid, signal.SIGKILL)


def test_a_worker_killed_outright_kills_its_client_with_the_same_signal(warm_start) -> None:
    """SIGKILL to the worker (as the out-of-memory killer sends it to a rank): the client dies of SIGKILL too, as the
    process its parent started would have, and does not start the module again cold (SIGKILL can have no handler)."""
    wait_warm(warm_start)
    agent = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=1", "--no-python"]
    before = sleepers()
    process = subprocess.Popen(
        [*agent, "sleep", "60"], cwd=ROOT, start_new_session=True, stderr=subprocess.PIPE, text=True
    )
    orphan = started_sleeper(before)
    workers = workers_of(warm_start)
    assert workers, "the agent runs in a worker of the zygote"
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL
    for pid in orphan:  # first: the agent's orphaned child holds the stderr pipe open until it ends
        os.kill(pid, signal.SIGKILL)
    assert "Error in sitecustomize" not in process.stderr.read()


def test_a_training_run_computes_the_same_losses_warm_and_cold(warm_start, staged, monkeypatch) -> None:
    from tests.distributed.harness import train

    wait_warm(warm_start)
    overrides = ["train.max_steps=3", "train.save_steps=3"]
    warm = train(staged, "warm", overrides)
    monkeypatch.delenv("TANDEM_WARM_SOCKET")
    cold = train(staged, "cold", overrides)
    assert warm.losses() == cold.losses() and len(warm.losses()) == 3
