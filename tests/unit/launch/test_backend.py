"""The launch interface (launch/backend.py): `run_job` submits, follows and always cancels what it submitted, with a
failure's grace after a TandemError and a cancel's after Ctrl-C or SIGTERM; a submission whose start fails midway
cancels what it started before raising. The backend and its submission here are stand-ins that record the calls:
what each real backend's cancel does is in tests/unit/launch/backends/ and the suites that run its nodes."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from core.errors import RetryableError, UserError
from launch.backend import run_job, started
from launch.job import TRAIN, Info, OnProgress, PhaseJob


@dataclass
class Recorded:
    """A submission that records its calls; `follow` raises `error` when given one."""

    error: BaseException | None = None
    calls: list[str] = field(default_factory=list)

    def follow(self, on_progress: OnProgress | None) -> None:
        self.calls.append("follow")
        if self.error is not None:
            raise self.error

    def cancel(self, *, failed: bool) -> None:
        self.calls.append(f"cancel(failed={failed})")


@dataclass
class OneSubmission:
    """A backend whose submit hands back `submitted` (only what run_job calls is here)."""

    submitted: Recorded

    def submit(self, job: PhaseJob, info: Info) -> Recorded:
        self.submitted.calls.append("submit")
        return self.submitted


JOB = PhaseJob(written=None, phase=TRAIN)  # type: ignore[arg-type] - the stand-ins never read it


def test_a_phase_that_finished_is_followed_then_released() -> None:
    submitted = Recorded()
    run_job(OneSubmission(submitted), JOB, lambda _: None)  # type: ignore[arg-type] - a partial stand-in
    assert submitted.calls == ["submit", "follow", "cancel(failed=False)"]


@pytest.mark.parametrize(
    ("error", "failed"),
    [
        (UserError("train failed on node 1, rank 1: bad data"), True),
        (RetryableError("training stalled"), True),
        (KeyboardInterrupt(), False),  # Ctrl-C, or SIGTERM/SIGHUP unwound as one (flows/hangup.py)
        (SystemExit(143), False),  # SIGTERM from a Prefect worker (launch/agent.py raise_on_sigterm)
    ],
)
def test_whatever_ends_the_follow_the_submission_is_cancelled_with_its_grace(
    error: BaseException, failed: bool
) -> None:
    submitted = Recorded(error)
    with pytest.raises(type(error)) as raised:
        run_job(OneSubmission(submitted), JOB, lambda _: None)  # type: ignore[arg-type]
    assert raised.value is error
    assert submitted.calls == ["submit", "follow", f"cancel(failed={failed})"]


@pytest.mark.parametrize(("error", "failed"), [(RetryableError("host down"), True), (KeyboardInterrupt(), False)])
def test_a_start_that_fails_midway_cancels_what_it_started(error: BaseException, failed: bool) -> None:
    submitted = Recorded()

    def start() -> None:
        submitted.calls.append("node 0 started")
        raise error

    with pytest.raises(type(error)):
        started(submitted, start)
    assert submitted.calls == ["node 0 started", f"cancel(failed={failed})"]
    assert started(Recorded(), lambda: None).calls == []  # a start that returned: nothing cancelled
