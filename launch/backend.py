"""The launch interface, after TorchX's scheduler (torchx/schedulers/api.py): what every backend in launch/backends/
is, and the one way a phase goes through one.

A backend describes a phase (what it would run, as text a user reads: the torchrun lines, the node flow runs'
parameters, the sbatch script, the ssh commands, the Kubernetes objects; `--dry-run` prints it), submits it (starts
it on every node) and hands back the submission, which is followed to the end (the one supervise loop,
launch/supervise.py, or the SLURM job's own) and then cancelled: whatever of it still runs is stopped with the grace
of a failure or of a cancel, and what it holds is released, so that nothing outlives the phase and a retry never
overlaps the attempt before it. What an elastic run needs of a backend is part of the interface too: whether it can
run one at all (`elastic`), how a node slot is probed before an attempt, and the launch section of an attempt on the
slots that passed (launch/elastic.py).

`launch/phase.py` maps `launch.backend` names to these objects; nothing else knows a backend by its name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from config.sections.launch import LaunchConfig
from core.errors import TandemError
from launch.job import Info, OnProgress, PhaseJob
from storage.spec import Attempt, Spec


class Submitted(Protocol):
    """A phase a backend started on every node."""

    def follow(self, on_progress: OnProgress | None) -> None:
        """Return once every node finished well; raise the failure that caused the others (UserError: retrying
        cannot help; RetryableError: it may), or what stopped the phase (a stall, a cancel)."""
        ...

    def cancel(self, *, failed: bool) -> None:
        """Stop whatever of the phase still runs, with the grace of a failure (`failed`: its nodes can neither
        finish nor save) or of a cancel (launch.cancel_grace_s), and release what the submission holds; return once
        it stopped. Called once, whatever way the phase ended (nothing runs any more after `follow` returned)."""
        ...


class Backend(Protocol):
    """One way of getting a phase onto every node (`launch.backend`)."""

    @property
    def elastic(self) -> bool:
        """Whether it starts an elastic run's attempt on the nodes that passed its probe, fewer (or more) than the last
        attempt's (launch.min_nnodes/max_nnodes); a backend that cannot needs every node back."""
        ...

    def describe(self, job: PhaseJob) -> str:
        """What `submit` would run for `job`, as text a user reads; starts nothing and writes nothing."""
        ...

    def submit(self, job: PhaseJob, info: Info) -> Submitted:
        """Start `job` on every node; when it raises, nothing it started is left running."""
        ...

    def probe(self, spec: Spec, slot: int) -> str | None:
        """An elastic run's check of node slot `slot` before an attempt: the problem in one line, None when it may
        run a node."""
        ...

    def attempt_launch(self, launch: LaunchConfig, attempt: Attempt) -> LaunchConfig:
        """The launch section of an elastic run's attempt on the slots `attempt.nodes`."""
        ...


S = TypeVar("S", bound=Submitted)


def started(submitted: S, start: Callable[[], None]) -> S:
    """`submitted` once `start` (which starts it on every node) returned; when `start` raises, what it started is
    cancelled first (a failure's grace for a TandemError, a cancel's for Ctrl-C or SIGTERM)."""
    try:
        start()
    except BaseException as exc:
        submitted.cancel(failed=isinstance(exc, TandemError))
        raise
    return submitted


def run_job(backend: Backend, job: PhaseJob, info: Info, on_progress: OnProgress | None = None) -> None:
    """Submit `job`, follow it to the end and cancel what is left of it whatever way that ended: returns when every
    node finished, or raises the failure that caused the others once every node stopped; after a failure the
    survivors get its short grace, after a cancel (Ctrl-C, SIGTERM) the cancel's."""
    submitted = backend.submit(job, info)
    failed = False
    try:
        submitted.follow(on_progress)
    except TandemError:
        failed = True  # not a cancel: the survivors get a failure's short grace (launch/agent.py grace_for)
        raise
    finally:
        submitted.cancel(failed=failed)
