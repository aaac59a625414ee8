"""Which nodes an attempt of an elastic run uses (launch.min_nnodes, launch.max_nnodes): the nodes that pass the
node-local preflight checks, at least min_nnodes of them. The first attempt takes up to launch.nnodes, a retry up to
launch.max_nnodes (it may grow the job when hosts are free); with train.global_batch_size the optimisation is the
same on any of those world sizes, and the trainer resumes a checkpoint of another world size (trainer/reshard.py).

The local backend's nodes are slots 0..max_nnodes-1 on this machine; the other backends keep today's behaviour
(every node must come back).
"""

from __future__ import annotations

from collections.abc import Callable

from config.errors import RetryableError
from config.schema import FinetuneConfig
from storage.checkpoints import latest_complete
from storage.spec import Attempt, Spec


def is_elastic(cfg: FinetuneConfig) -> bool:
    """Whether launch.min_nnodes/max_nnodes let an attempt run on another number of nodes."""
    return cfg.node_range != (cfg.launch.nnodes, cfg.launch.nnodes)


def next_attempt(spec: Spec, previous: list[Attempt], probe: Callable[[int], str | None]) -> Attempt:
    """The nodes of the next attempt: every slot probed, the healthy ones taken in order (up to launch.nnodes the
    first time, launch.max_nnodes after); RetryableError when fewer than launch.min_nnodes pass."""
    low, high = spec.config.node_range
    wanted = high if previous else spec.config.launch.nnodes
    healthy, left_out = [], {}
    for slot in range(high):
        problem = probe(slot)
        if problem is None:
            healthy.append(slot)
        else:
            left_out[str(slot)] = problem
    chosen = healthy[:wanted]
    if len(chosen) < low:
        reasons = "; ".join(left_out.values())
        raise RetryableError(f"only {len(chosen)} of {high} nodes passed preflight ({reasons}); launch.min_nnodes="
                             f"{low} needs more: the next retry tries again")
    newest = latest_complete(spec.run_url) if spec.config.train.resume == "auto" else None
    return Attempt(number=len(previous) + 1, nodes=chosen, world_size=len(chosen) * spec.config.launch.nproc_per_node,
                   from_step=newest.step if newest else 0, left_out=left_out)
