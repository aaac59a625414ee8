"""Which nodes an attempt of an elastic run uses (launch.min_nnodes, launch.max_nnodes): the nodes that pass the
node-local preflight checks, at least min_nnodes of them. The first attempt takes up to launch.nnodes, a retry up to
launch.max_nnodes (it may grow the job when hosts are free); with train.global_batch_size the optimisation is the
same on any of those world sizes, and the trainer resumes a checkpoint of another world size
(trainer/checkpointing/reshard.py).

The local backend's nodes are slots 0..max_nnodes-1 on this machine, probed by preflight's node-local checks; the
ssh backend's are the hosts of launch.hosts, probed over ssh (reachable with the key, the checkout and its Python),
and an attempt runs on the hosts that answer, node 0 first. The kubernetes backend's slots are pods, which no probe
can place ahead: each attempt asks for its nodes, and when the cluster starts fewer within
launch.kubernetes.schedule_timeout_s (launch/backends/kubernetes.py raises TooFewNodes), the next attempt starts
at once on that many (`cap`), not as a retry. The other backends keep today's behaviour (every node must come back).
"""

from __future__ import annotations

from collections.abc import Callable

from config.schema import FinetuneConfig
from config.sections.launch import LaunchConfig
from core.errors import RetryableError, TooFewNodes
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


def probe_for(spec: Spec) -> Callable[[int], str | None]:
    """How the slots of `spec`'s backend are probed: over ssh for the ssh backend's hosts, not at all for pods (the
    scheduler decides), else preflight's node-local
    checks on this machine."""
    if spec.config.launch.backend == "ssh":
        from launch.backends.ssh import probe_host

        return lambda slot: probe_host(spec.config.launch, slot)
    if spec.config.launch.backend == "kubernetes":
        return lambda slot: None  # the cluster's scheduler places the pods; each pod preflights its own node
    from launch.preflight import probe_node

    return lambda slot: probe_node(spec, slot)


def attempt_launch(launch: LaunchConfig, attempt: Attempt) -> LaunchConfig:
    """The launch section of an attempt: its node count, and for the ssh backend its hosts (node 0 first), which also
    moves the rendezvous to the first of them when launch.master_addr is unset."""
    update: dict[str, object] = {"nnodes": len(attempt.nodes)}
    if launch.backend == "ssh":
        # The hosts decide an ssh section's node count (config/sections/launch.py), so the attempt's section holds
        # its own hosts, and no max_nnodes above them; the next attempt starts again from the whole list.
        update.update(hosts=[launch.hosts[slot] for slot in attempt.nodes], max_nnodes=None)
    return launch.model_copy(update=update)
