"""The run lock on a local folder and on a real S3 endpoint (moto's server on 127.0.0.1): one holder at a time,
a one-line refusal naming it, release however the body ends, takeover of an expired lease, and a race between
processes that exactly one wins."""

from __future__ import annotations

import json
import time

import pytest

from core.errors import UserError
from storage.conditional import create_exclusive
from storage.fs import exists, read_bytes, remove
from storage.location import Location, join
from storage.run_lock import RunLock
from tests.racing import race


@pytest.fixture(params=["local", "s3"])
def run_url(request, tmp_path) -> Location:
    """A run directory on a local folder or in a new bucket on the S3 endpoint (with the endpoint as its option)."""
    if request.param == "local":
        return Location(str(tmp_path / "runs" / "r1"))
    return join(request.getfixturevalue("s3_bucket"), "tandem/runs/r1")


def holder(run_url: Location) -> dict:
    return json.loads(read_bytes(join(run_url, "LOCK")))


def test_a_second_pipeline_is_refused_until_the_first_ends(run_url) -> None:
    first = RunLock(run_url, "r1", "flow-a", lease_s=60)
    with first.hold():
        assert holder(run_url)["flow_run_id"] == "flow-a"
        with pytest.raises(UserError) as info:
            RunLock(run_url, "r1", "flow-b", lease_s=60).acquire()
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith("run r1 is already running (flow run flow-a on ")
        assert "; wait for it, cancel it, or choose another run.name" in message
    assert not exists(join(run_url, "LOCK"))
    with RunLock(run_url, "r1", "flow-b", lease_s=60).hold():  # a sequential re-run continues the run
        assert holder(run_url)["flow_run_id"] == "flow-b"


def test_the_lock_is_released_when_the_body_fails(run_url) -> None:
    with pytest.raises(RuntimeError, match="training failed"), RunLock(run_url, "r1", "flow-a", lease_s=60).hold():
        raise RuntimeError("training failed")
    assert not exists(join(run_url, "LOCK"))


def test_an_expired_lease_is_taken_over_and_a_live_one_is_renewed(run_url, caplog) -> None:
    crashed = RunLock(run_url, "r1", "flow-crashed", lease_s=0.5)
    crashed.acquire()  # and never released: its process "died"
    time.sleep(0.6)
    with caplog.at_level("WARNING", logger="storage.run_lock"), RunLock(run_url, "r1", "flow-b", lease_s=2.0).hold():
        assert holder(run_url)["flow_run_id"] == "flow-b"
        time.sleep(2.5)  # longer than the lease: only the heartbeat keeps it
        with pytest.raises(UserError, match="already running \\(flow run flow-b"):
            RunLock(run_url, "r1", "flow-c", lease_s=60).acquire()
    assert any("took over the lock of flow run flow-crashed" in r.getMessage() for r in caplog.records)
    assert not crashed.renew()  # the crashed holder, were it to wake up, finds the lock is not its own


def test_an_unreadable_lock_counts_as_expired(run_url) -> None:
    assert create_exclusive(join(run_url, "LOCK"), b"not json")
    with RunLock(run_url, "r1", "flow-a", lease_s=60).hold():
        assert holder(run_url)["flow_run_id"] == "flow-a"


def try_lock(run_url: Location, name: str) -> str:
    """Acquire in a child process (and keep it: the process ends holding it); 'held' or the refusal."""
    try:
        RunLock(run_url, "r1", name, lease_s=60).acquire()
    except UserError as exc:
        return str(exc)
    return "held"


def test_racing_pipelines_exactly_one_wins(run_url) -> None:
    results = race(try_lock, [(run_url, f"flow-{i}") for i in range(3)])
    assert results.count("held") == 1, results
    winner = f"flow-{results.index('held')}"
    assert holder(run_url)["flow_run_id"] == winner
    assert all(r.startswith(f"run r1 is already running (flow run {winner} on ") for r in results if r != "held")


def dead_pid() -> int:
    """The pid of a process of this host that has ended."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def dead_holder(run_url, *, host: str | None = None, pid: int | None = None, renewed_ago: float, expires_in: float):
    """A LOCK left by a pipeline that died: its lease still runs, nobody renews it."""
    import socket

    now = time.time()
    doc = {
        "schema": "tandem.run-lock/1",
        "run_id": "r1",
        "token": "old",
        "flow_run_id": "flow-dead",
        "host": host or socket.gethostname(),
        "pid": pid if pid is not None else dead_pid(),
        "since": "earlier",
        "renewed_at": now - renewed_ago,
        "expires_at": now + expires_in,
    }
    assert create_exclusive(join(run_url, "LOCK"), json.dumps(doc).encode())


def test_a_rerun_waits_for_a_dead_pipelines_lease_then_takes_the_run(run_url, caplog) -> None:
    started = time.monotonic()  # before the holder is written (its lease runs from then): a loaded machine may take
    dead_holder(run_url, renewed_ago=1, expires_in=1.5)  # a while to start and reap the dead pid
    with caplog.at_level("WARNING", logger="storage.run_lock"), RunLock(run_url, "r1", "flow-b", lease_s=60).hold():
        assert holder(run_url)["flow_run_id"] == "flow-b"
        assert time.monotonic() - started >= 1.4  # it waited for the lease rather than refusing
    assert any("is gone; waiting 1 s for its lease to expire" in r.getMessage() for r in caplog.records)


def test_take_over_replaces_a_dead_pipeline_at_once_but_never_a_live_one(run_url) -> None:
    dead_holder(run_url, renewed_ago=1, expires_in=600)
    with RunLock(run_url, "r1", "flow-b", lease_s=60).hold(take_over=True):
        assert holder(run_url)["flow_run_id"] == "flow-b"
    # Another host's pipeline that renewed a moment ago is alive as far as anyone can tell: refused, option or not.
    dead_holder(run_url, host="elsewhere", pid=1, renewed_ago=1, expires_in=600)
    with pytest.raises(UserError, match="already running \\(flow run flow-dead on elsewhere"):
        RunLock(run_url, "r1", "flow-c", lease_s=60).acquire(take_over=True)
    # This host's live process (pid 1) is provably alive.
    remove(join(run_url, "LOCK"))
    dead_holder(run_url, pid=1, renewed_ago=100, expires_in=600)
    with pytest.raises(UserError, match="already running"):
        RunLock(run_url, "r1", "flow-c", lease_s=60).acquire(take_over=True)
    # Another host's pipeline that missed two renewals is gone: taken over.
    remove(join(run_url, "LOCK"))
    dead_holder(run_url, host="elsewhere", pid=1, renewed_ago=40, expires_in=600)
    with RunLock(run_url, "r1", "flow-d", lease_s=60).hold(take_over=True):
        assert holder(run_url)["flow_run_id"] == "flow-d"
