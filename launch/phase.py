"""One phase (train, eval or probe) on every node, through the configured launch backend.

A backend (launch/job.py `Backend`) is one function `run(job, info, on_progress)` in launch/backends/ that gets
`python -m trainer` (or `trainer.evaluate`, `trainer.probe`) running on every node, each node through
launch/node.py `run_node`, and returns when all of them finished, or raises naming the first node that failed
(UserError: retrying cannot help; RetryableError: it may). Adding a backend is one module and one entry in `backends`;
nothing above this module changes, and no backend imports this one.
"""

from __future__ import annotations

from launch.claim import LEASE_S, wait_for_claims
from launch.job import Backend, Info, OnProgress, PhaseJob
from launch.liveness import RENEW_S, STALE_S, PipelineBeat
from storage.spec import WrittenSpec


def backends() -> dict[str, Backend]:
    """launch.backend -> its run function (imported here so that a backend's dependencies load only when used)."""
    from launch.backends.kubernetes import run_kubernetes_nodes
    from launch.backends.local import run_local_job
    from launch.backends.prefect import run_prefect_nodes
    from launch.backends.slurm import run_slurm_nodes
    from launch.backends.ssh import run_ssh_nodes

    return {
        "local": run_local_job,
        "prefect": run_prefect_nodes,
        "slurm": run_slurm_nodes,
        "ssh": run_ssh_nodes,
        "kubernetes": run_kubernetes_nodes,
    }


def run_phase(
    written: WrittenSpec, phase: str, info: Info, *, model_url: str | None = None, on_progress: OnProgress | None = None
) -> None:
    """Run `phase` on every node and return when all finished; preflight precedes training on each node."""
    launch = written.spec.config.launch
    # A rerun after this run's pipeline died: its nodes stop within the liveness bound, then their claims lapse.
    wait_for_claims(written.spec.run, launch.nnodes, info, STALE_S + RENEW_S + launch.cancel_grace_s + LEASE_S)
    # Renewed while the phase runs: the nodes stop on their own once it is not (launch/liveness.py, no orphans).
    with PipelineBeat(written.spec.run).hold():
        backends()[written.spec.config.launch.backend](PhaseJob(written, phase, model_url), info, on_progress)
