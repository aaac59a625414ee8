"""Which nodes an attempt of an elastic run uses (launch.min_nnodes, launch.max_nnodes): the nodes that pass the
node-local preflight checks, at least min_nnodes of them. The first attempt takes up to launch.nnodes, a retry up to
launch.max_nnodes (it may grow the job when hosts are free); with train.global_batch_size the optimisation is the
same on any of those world sizes, and the trainer resumes a checkpoint of another world size
(trainer/checkpointing/reshard.py).

How a slot is probed and what an attempt's launch section is are the backend's (launch/backend.py `Backend.probe`,
`attempt_launch`): the local backend's nodes are slots 0..max_nnodes-1 on this machine, probed by preflight's
node-local checks; the ssh backend's are the hosts of launch.hosts, probed over ssh (reachable with the key, the
checkout and its Python), and an attempt runs on the hosts that answer, node 0 first. The kubernetes backend's slots
are pods, which no probe can place ahead: each attempt asks for its nodes, and when the cluster starts fewer within
launch.kubernetes.schedule_timeout_s (launch/backends/kubernetes_status.py raises TooFewNodes), the next attempt
starts at once on that many (`cap`), not as a retry. The other backends keep today's behaviour (every node must come
back).
"""

from __future__ import annotations

from collections.abc import Callable

from config.schema import FinetuneConfig
from config.sections.launch import LaunchConfig
from core.errors import RetryableError, TooFewNodes
from launch.backend import Backend
from storage.checkpoints import latest_complete
from storage.spec import Attempt, Spec


def is_elastic(cfg: FinetuneConfig) -> bool:
    """Whether launch.min_nnodes/max_nnodes let an attempt run on another number of nodes."""
    return cfg.node_range != (cfg.launch.nnodes, cfg.launch.nnodes)


def next_attempt(
    spec: Spec, previous: list[Attempt], probe: Callable[[int], str | None], cap: TooFewNodes | None = None
) -> Attempt:
    """The nodes of the next attempt: every slot probed, the healthy ones taken in order (up to launch.nnodes the
    first time, launch.max_nnodes after, at most `cap.nodes` after an attempt the cluster could not place whole);
    RetryableError when fewer than launch.min_nnodes pass."""
    low, high = spec.config.node_range
    wanted = high if previous else spec.config.launch.nnodes
    healthy, left_out = [], {}
    for slot in range(high):
        problem = probe(slot)
        if problem is None:
            healthy.append(slot)
        else:
            left_out[str(slot)] = problem
    if cap is not None:  # the slots the cluster could not place, with its reason
        left_out.update({str(slot): str(cap) for slot in healthy[cap.nodes : wanted]})
        wanted = min(wanted, cap.nodes)
    chosen = healthy[:wanted]
    if len(chosen) < low:
        reasons = "; ".join(left_out.values())
        raise RetryableError(
            f"only {len(chosen)} of {high} nodes passed preflight ({reasons}); launch.min_nnodes="
            f"{low} needs more: the next retry tries again"
        )
    newest = latest_complete(spec.run) if spec.config.train.resume == "auto" else None
    return Attempt(
        number=len(previous) + 1,
        nodes=chosen,
        world_size=len(chosen) * spec.config.launch.nproc_per_node,
        from_step=newest.step if newest else 0,
        left_out=left_out,
    )


def attempt_on(
    backend: Backend, spec: Spec, previous: list[Attempt], cap: TooFewNodes | None = None
) -> tuple[Attempt, LaunchConfig]:
    """The next attempt of an elastic run on `backend`, its slots probed by the backend, and its launch section."""
    attempt = next_attempt(spec, previous, lambda slot: backend.probe(spec, slot), cap)
    return attempt, backend.attempt_launch(spec.config.launch, attempt)


def resized(launch: LaunchConfig, attempt: Attempt) -> LaunchConfig:
    """The launch section of an attempt on as many nodes as it has (what a backend's `attempt_launch` changes unless
    the attempt's slots name hosts)."""
    return launch.model_copy(update={"nnodes": len(attempt.nodes)})
