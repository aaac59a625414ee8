"""The preference objectives' optimizer step and evaluation: sums over every rank, divided once.

A step's loss is the mean of its units' losses over the global batch (plus, for ORPO, the chosen answers'
cross-entropy per token of the global batch): each rank scales its micro-batches' summed losses by the global counts,
so the gradient is the same on any number of ranks and micro-batches. KTO's reference point is computed first, from
every rank's mismatched sequences, all-reduced, and clamped at 0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from core.errors import UserError
from storage.split_reader import Split
from trainer import faults
from trainer.distributed import Dist, dist_sum
from trainer.heartbeat import Heartbeat
from trainer.metrics import StepStats
from trainer.preference_data import PreferenceBatch, collate_preference
from trainer.preference_step import SUM_KEYS, Objective, Sums, kl_sums, metrics_of, micro_batch

if TYPE_CHECKING:
    from trainer.reference_table import ReferenceTable


def kl_point(model: Any, batches: Sequence[PreferenceBatch], objective: Objective, dist: Dist) -> float:
    """KTO's reference point: the mean policy/reference log-ratio of the global batch's mismatched sequences,
    clamped at 0 (0 for the other objectives)."""
    if objective.name != "kto":
        return 0.0
    local = [kl_sums(model, batch, dist.device) for batch in batches]
    total, count = dist_sum([sum(s for s, _ in local), sum(n for _, n in local)], dist)
    return max(total / max(count, 1.0), 0.0)


def add(into: Sums, sums: Sums) -> None:
    """Accumulate metric sums."""
    for key in SUM_KEYS:
        into[key] = into.get(key, 0.0) + sums.get(key, 0.0)


def reduce(sums: Sums, dist: Dist) -> Sums:
    """The sums of every rank."""
    return dict(zip(SUM_KEYS, dist_sum([sums.get(key, 0.0) for key in SUM_KEYS], dist), strict=True))


def preference_step(
    engine: Any,
    batches: list[PreferenceBatch],
    dist: Dist,
    heartbeat: Heartbeat,
    step: int,
    objective: Objective,
    table: ReferenceTable | None = None,
) -> tuple[StepStats, dict[str, float]]:
    """Forward/backward every micro-batch so that the gradient is that of the global batch's mean loss; returns
    the step's stats and its preference metrics (reward accuracy and margin on the step's units). `table`: the
    reference log-probabilities of full fine-tuning."""
    heartbeat.beat(step)
    units, chosen_tokens = dist_sum([sum(b.units for b in batches), sum(b.chosen_tokens for b in batches)], dist)
    kl = kl_point(engine, batches, objective, dist)
    # DeepSpeed divides by the accumulation steps and averages gradients over ranks: undone here, as for sft.
    scale = dist.world_size * len(batches)
    sums: Sums = {}
    tokens = pads = positions = 0
    compute_s = 0.0
    for batch in batches:
        started = time.perf_counter()
        faults.maybe_slow(dist.rank)
        losses, nll, micro = micro_batch(engine, batch, objective, dist.device, kl, table)
        loss = losses / max(units, 1.0) + (nll / max(chosen_tokens, 1.0) if objective.name == "orpo" else 0.0)
        heartbeat.beat(step)
        compute_s += time.perf_counter() - started
        engine.backward(loss * scale)
        engine.step()
        add(sums, micro)
        pad, total = batch.sequences.padding
        pads, positions, tokens = pads + pad, positions + total, tokens + total - pad
    reduced = reduce(sums, dist)
    all_tokens, all_pads, all_positions = dist_sum([tokens, pads, positions], dist)
    metrics = metrics_of(reduced)
    stats = StepStats(
        metrics["loss"],
        int(reduced["chosen_tokens"] + reduced["rejected_tokens"]),
        int(all_tokens),
        all_pads / max(all_positions, 1.0),
        compute_s,
    )
    extra = {key: metrics[key] for key in ("reward_accuracy", "reward_margin")}
    return stats, extra | ({"kl": kl} if objective.name == "kto" else {})


@torch.no_grad()
def preference_eval(
    model: Any,
    rows: Split,
    indices: Sequence[int],
    objective: Objective,
    dist: Dist,
    *,
    batch_size: int,
    pad_id: int,
    lockstep: bool = False,
    table: ReferenceTable | None = None,
) -> dict[str, Any]:
    """The preference metrics over the rows `indices` of an eval split: row i to rank i % world, sums all-reduced
    and divided once (so equal to one process's). KTO's reference point comes from the same rows, each with the
    answer of the next row as its mismatched sequence. `lockstep` (ZeRO-3): every rank runs as many passes."""
    if not len(indices):
        raise UserError(f"{rows.shards[0].path if rows.shards else 'the eval split'}: no eval rows to evaluate")
    mine = list(indices[dist.rank :: dist.world_size])
    partner = {index: indices[(k + 1) % len(indices)] for k, index in enumerate(indices)}
    groups = [mine[start : start + batch_size] for start in range(0, len(mine), batch_size)]
    passes = math.ceil(math.ceil(len(indices) / dist.world_size) / batch_size) if lockstep else len(groups)

    def batch_of(k: int) -> PreferenceBatch:
        group = groups[k] if k < len(groups) else [indices[0]]  # a throw-away pass, to keep ZeRO-3 in step
        feedback = [rows.feedback(i) for i in group]
        partners = [rows[partner[i]] for i in group] if objective.name == "kto" else []
        return collate_preference([rows[i] for i in group], feedback, pad_id, partners, group)

    kl = 0.0
    if objective.name == "kto":
        local = [kl_sums(model, batch_of(k), dist.device) for k in range(passes)]
        total, count = dist_sum(
            [sum(s for k, (s, _) in enumerate(local) if k < len(groups)), sum(len(g) for g in groups)], dist
        )
        kl = max(total / max(count, 1.0), 0.0)
    sums: Sums = {}
    for k in range(passes):
        _, _, micro = micro_batch(model, batch_of(k), objective, dist.device, kl, table)
        if k < len(groups):
            add(sums, micro)
    metrics = metrics_of(reduce(sums, dist))
    return {**metrics, "objective": objective.name, **({"kl": kl} if objective.name == "kto" else {})}
