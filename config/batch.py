"""The global batch as the invariant of an optimisation: gradient accumulation derived from it per world size.

With `train.global_batch_size` set, a step consumes the same rows whatever the number of ranks, so a run that
continues on fewer (or more) nodes keeps its learning-rate schedule and its loss normalisation. The derivation and
its error live here, in one place: the config check (every world size the launch may use), the spec and the
trainer all call `accumulation_steps`.
"""

from __future__ import annotations

from math import lcm

from core.errors import UserError


def accumulation_steps(global_batch: int | None, micro: int, accumulation: int, world_size: int) -> int:
    """Micro-batches per rank per optimizer step: derived from the global batch when it is set, else
    train.gradient_accumulation_steps."""
    if global_batch is None:
        return accumulation
    problem = batch_problem(global_batch, micro, [world_size])
    if problem:
        raise UserError(problem)
    return global_batch // (micro * world_size)


def batch_problem(global_batch: int, micro: int, world_sizes: list[int]) -> str | None:
    """One line naming the values that do not divide and the nearest valid choices, or None when
    `global_batch` divides into micro-batches evenly on every world size in `world_sizes`."""
    bad = [w for w in world_sizes if global_batch % (micro * w)]
    if not bad:
        return None
    step = lcm(*(micro * w for w in world_sizes))
    lower, upper = global_batch // step * step, (global_batch // step + 1) * step
    batches = " or ".join(str(b) for b in (lower, upper) if b > 0)
    micros = [m for m in range(1, global_batch + 1) if all(global_batch % (m * w) == 0 for w in world_sizes)]
    near_micro = min(micros, key=lambda m: (abs(m - micro), m)) if micros else None
    where = f"{bad[0]} ranks"
    if len(world_sizes) > 1:
        where += f" (world sizes {world_sizes[0]}..{world_sizes[-1]} come from launch.min_nnodes..max_nnodes)"
    fix = f"nearest valid: train.global_batch_size={batches}"
    if near_micro is not None:
        fix += f", or train.micro_batch_size={near_micro}"
    return (
        f"train.global_batch_size={global_batch} does not divide into train.micro_batch_size={micro} x {where}; {fix}"
    )
