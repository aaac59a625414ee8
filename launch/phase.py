"""One phase (train, eval or probe) on every node, through the configured launch backend; and the registry of
backends, the one place that maps `launch.backend` names to objects, and where a run's config is held to what its
backend can do (`run_backend`: an elastic node range needs an elastic backend).

A backend (launch/backend.py `Backend`) is one object in launch/backends/ that describes, submits and cancels a phase
whose every node runs launch/node.py `run_node`, and whose submission follows it to the end, raising naming the first
node that failed (UserError: retrying cannot help; RetryableError: it may). Adding a backend is one module and one
entry in `backends`; nothing above this module changes, and no backend imports this one.
"""

from __future__ import annotations

from config.schema import FinetuneConfig
from core.errors import UserError
from launch.backend import Backend, run_job
from launch.claim import LEASE_S, wait_for_claims
from launch.elastic import is_elastic
from launch.job import Info, OnProgress, Phase, PhaseJob
from launch.liveness import RENEW_S, STALE_S, PipelineBeat
from storage.location import Location
from storage.spec import WrittenSpec


def backends() -> dict[str, Backend]:
    """launch.backend -> its backend (imported here so that a backend's dependencies load only when used)."""
    from launch.backends.kubernetes import KubernetesBackend
    from launch.backends.local import LocalBackend
    from launch.backends.prefect import PrefectBackend
    from launch.backends.slurm import SlurmBackend
    from launch.backends.ssh import SshBackend

    return {
        "local": LocalBackend(),
        "prefect": PrefectBackend(),
        "slurm": SlurmBackend(),
        "ssh": SshBackend(),
        "kubernetes": KubernetesBackend(),
    }


def backend_for(name: str) -> Backend:
    """The backend `launch.backend` names (the config allows only the names of `backends`)."""
    return backends()[name]


def run_backend(cfg: FinetuneConfig) -> Backend:
    """The backend a run of `cfg` launches through, held to what `cfg` asks of it: a UserError (exit 2) for an
    elastic node range (launch.min_nnodes/max_nnodes) on a backend that needs every node back. Every run passes here
    before it starts anything (flows/cli.py: the config's command line and the flow boundary; the dry run)."""
    backend = backend_for(cfg.launch.backend)
    if is_elastic(cfg) and not backend.elastic:
        able = [name for name, each in backends().items() if each.elastic]
        raise UserError(
            f"launch.min_nnodes/max_nnodes: only launch.backend={', '.join(able[:-1])} or {able[-1]} picks the "
            f"surviving nodes so far, not {cfg.launch.backend}; leave them empty (every node must come back)"
        )
    return backend


def run_phase(
    written: WrittenSpec,
    phase: Phase,
    info: Info,
    *,
    model: Location | None = None,
    on_progress: OnProgress | None = None,
    env: dict[str, str] | None = None,
) -> None:
    """Run `phase` on every node and return when all finished; preflight precedes training on each node; `model` is
    the model an evaluation reads; `env` is added to the ranks' environment (PhaseJob.env)."""
    launch = written.spec.config.launch
    # A rerun after this run's pipeline died: its nodes stop within the liveness bound, then their claims lapse.
    wait_for_claims(written.spec.run, launch.nnodes, info, STALE_S + RENEW_S + launch.cancel_grace_s + LEASE_S)
    # Renewed while the phase runs: the nodes stop on their own once it is not (launch/liveness.py, no orphans).
    with PipelineBeat(written.spec.run).hold():
        job = PhaseJob(written, phase, model, env or {})
        run_job(backend_for(launch.backend), job, info, on_progress)
