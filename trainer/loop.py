"""The training loop: token-weighted loss across ranks and accumulation, metrics; checkpoints and the export
through the checkpointer (trainer/checkpointing/policy.py)."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from config.deepspeed import ModelShape, resolve_from_runtime, zero_stage
from core.errors import UserError
from storage.local_dataset import open_split
from storage.node_cache import cache_root, node_cache
from storage.shards import PAIR
from storage.spec import Spec
from storage.split_reader import Split
from trainer import faults, guards
from trainer.cancel import EXIT_CANCELLED, CancelWatch, SaveClock
from trainer.checkpointing.policy import Checkpointer, DeepSpeedIO, Policy
from trainer.chunked_loss import LossHead
from trainer.cuda_build import plain_arch_list
from trainer.data import Batch, GlobalOrder, rank_micro_batches
from trainer.distributed import Dist, dist_sum
from trainer.evaluate import local_sums, reduced_metrics, sample_rows
from trainer.heartbeat import Heartbeat
from trainer.lean_imports import import_muon_uncompiled_unless_configured
from trainer.metrics import MetricsWriter, StepStats, log_memory, peak_device_memory
from trainer.model import (
    PartitionedLoad,
    ensure_pad_token_id,
    load_base,
    make_trainable,
    model_config,
    partitioned_load,
)
from trainer.preference_data import rank_preference_batches
from trainer.preference_step import Objective
from trainer.preference_train import preference_eval, preference_step
from trainer.profiler import StepProfiler
from trainer.reference_table import ReferenceTable, load_or_compute
from trainer.straggler import StragglerWatch

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def summed_loss(engine: Any, batch: Batch, device: torch.device, loss: LossHead) -> torch.Tensor:
    """Cross-entropy summed over the predicted positions of a micro-batch (labels shifted by one)."""
    out = engine(**batch.model_inputs(device), **loss.forward_kwargs(device))
    return loss.summed(out, batch.labels)


def train_step(
    engine: Any, batches: list[Batch], dist: Dist, heartbeat: Heartbeat, step: int, loss_head: LossHead
) -> StepStats:
    """Forward/backward every micro-batch so that the gradient is d(total loss / global target tokens)."""
    local_targets = sum(b.target_tokens for b in batches)
    heartbeat.beat(step)  # beats mark arrival at a collective: a stuck rank's beat is the oldest
    (global_targets,) = dist_sum([local_targets], dist)
    # DeepSpeed divides by the accumulation steps and averages gradients over ranks; undo both so each
    # target token weighs the same whatever the micro-batch, accumulation and world size.
    scale = dist.world_size * len(batches) / max(global_targets, 1.0)
    loss_sum, tokens, pads, positions, compute_s = 0.0, 0, 0, 0, 0.0
    for batch in batches:
        started = time.perf_counter()
        faults.maybe_slow(dist.rank)
        faults.maybe_stall(dist.rank, step)
        loss = faults.maybe_poison(summed_loss(engine, batch, dist.device, loss_head), dist.rank, step)
        heartbeat.beat(step)
        # Only the forward pass is timed for straggler detection: DeepSpeed's backward reduces
        # gradients across ranks, so it would include waiting for the slowest rank.
        compute_s += time.perf_counter() - started
        engine.backward(loss * scale)
        engine.step()
        loss_sum += loss.item()
        pad, total = batch.padding
        pads, positions, tokens = pads + pad, positions + total, tokens + total - pad
    total_loss, total_tokens, total_pads, total_positions = dist_sum([loss_sum, tokens, pads, positions], dist)
    return StepStats(
        total_loss / max(global_targets, 1.0),
        int(global_targets),
        int(total_tokens),
        total_pads / max(total_positions, 1.0),
        compute_s,
    )


def build_engine(spec: Spec, dist: Dist) -> tuple[Any, int, PartitionedLoad | None]:
    """(DeepSpeed engine, pad token id, the partitioned load to keep alive under ZeRO-3) for the spec's model and
    method."""
    import deepspeed
    from transformers import get_scheduler

    train = spec.config.train
    bf16 = dist.device.type == "cuda"
    if bf16:
        plain_arch_list()
    ds = resolve_from_runtime(spec.deepspeed, bf16=bf16, shape=ModelShape.of(model_config(spec.model_path)))
    # Each rank saves under its own tag (rank-{r}); DeepSpeed's cross-rank tag check would flag that.
    ds.setdefault("checkpoint", {})["tag_validation"] = "Ignore"
    seed_everything(train.seed)  # the same initial weights (LoRA's random A) on every rank
    partitioned = partitioned_load(ds, train.method, spec.config.deepspeed.zero3_init)
    log_memory("before loading the model")
    base = load_base(spec.model_path, method=train.method, bf16=bf16, zero3=zero_stage(ds) == 3)
    log_memory("model loaded" + (" (partitioned by ZeRO-3)" if partitioned else ""))
    pad_id = ensure_pad_token_id(base, spec.model_path)
    model = make_trainable(base, train)
    if train.compile:
        model.compile()  # in place: the state dict's names stay those of the uncompiled model
    warmup = math.ceil(train.warmup_ratio * spec.total_steps)

    def scheduler(optimizer: Any) -> Any:
        return get_scheduler(
            train.lr_scheduler, optimizer, num_warmup_steps=warmup, num_training_steps=spec.total_steps
        )

    params = [p for p in model.parameters() if p.requires_grad]
    import_muon_uncompiled_unless_configured(ds)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds, lr_scheduler=scheduler)
    log_memory("engine built")
    return engine, pad_id, partitioned


@dataclass
class Run:
    """What the step loop works with besides the spec: the engine and everything that watches or records a step."""

    engine: Any
    pad_id: int
    examples: Split
    order: GlobalOrder
    metrics: MetricsWriter
    straggler: StragglerWatch
    heartbeat: Heartbeat
    checkpointer: Checkpointer
    cancel: CancelWatch
    clock: SaveClock
    partitioned: PartitionedLoad | None = None  # kept alive for the run (ZeRO-3): see trainer/model.py
    reference: dict[str, ReferenceTable] = field(default_factory=dict)  # by split: full fine-tuning's dpo/ipo


def start_run(spec: Spec, dist: Dist) -> tuple[Run, int]:
    """Build the engine, resume (train.resume), and set up metrics and the watches; returns (run, first step)."""
    train_cfg = spec.config.train
    engine, pad_id, partitioned = build_engine(spec, dist)
    reference = full_reference(engine, spec, dist, pad_id)  # by the base: before any checkpoint is resumed
    seed_everything(train_cfg.seed + dist.rank)  # per-rank streams (dropout); restored on resume
    io = DeepSpeedIO(engine, spec, dist, zero_stage=zero_stage(spec.deepspeed))
    checkpointer = Checkpointer(
        io, Policy(train_cfg.save_steps, spec.total_steps, train_cfg.keep_latest_k), is_main=dist.is_main
    )
    start = checkpointer.resume()
    metrics = MetricsWriter(spec.run, enabled=dist.is_main, start_step=start)
    examples = split_of(spec, "train")
    order = GlobalOrder(len(examples), train_cfg.seed)
    order.epoch(start * spec.config.global_batch(dist.world_size) // max(len(examples), 1))  # before the first step
    run = Run(
        engine,
        pad_id,
        examples,
        order,
        metrics,
        StragglerWatch(train_cfg.straggler_check_steps, train_cfg.straggler_factor, dist),
        Heartbeat(dist.rank),
        checkpointer,
        CancelWatch(spec.config.launch.checkpoint_on_cancel or bool(train_cfg.preempt_grace_s)),
        SaveClock(train_cfg.save_every_minutes),
        partitioned,
        reference,
    )
    return run, start


def train(spec: Spec, dist: Dist) -> None:
    """Run the spec's optimizer steps (resuming if asked), logging, checkpointing and exporting."""
    run, start = start_run(spec, dist)
    log.info(
        "training %d rows (%d examples), steps %d..%d on %d ranks",
        len(run.examples),
        run.examples.examples,
        start + 1,
        spec.total_steps,
        dist.world_size,
    )
    loss_head = LossHead.of(run.engine, spec.config.train.loss_chunk_tokens)
    objective = Objective.of(spec.config.train)
    check_rows(run.examples, objective)
    profiler = StepProfiler(spec.config.train.profile_steps, start, spec.total_steps, spec.run, dist.rank)
    loop_started = time.perf_counter()
    for step in range(start, spec.total_steps):
        if run.cancel.should_stop(dist):
            run.checkpointer.cancelled(
                step, run.cancel.seconds_since_signal(), spec.config.train.preempt_grace_s, run.metrics.write
            )
            raise SystemExit(EXIT_CANCELLED)
        if faults.fires_at(dist.rank, step + 1):
            run.checkpointer.wait(run.metrics.write)
        faults.maybe_exit(dist.rank, step + 1)
        profiler.before(step + 1)
        started = time.perf_counter()
        with guards.out_of_memory_named(dist, step + 1):
            stats, extra, data_s = one_step(run, spec, dist, step, objective, loss_head)
        elapsed, done = time.perf_counter() - started, step + 1
        profiler.after(done, run.metrics.write)
        guards.check_loss(stats.loss, done)
        run.straggler.observe(stats.compute_s)
        for event in run.straggler.check(done):
            run.metrics.write(event)
        if done % spec.config.train.log_steps == 0 or done == spec.total_steps:
            record = step_record(run.engine, stats, done, spec.total_steps, elapsed, data_s) | extra
            if profiler.profiles(done):
                record["profiled"] = True  # its time includes the profiler's
            run.metrics.write({**record, "elapsed_s": time.perf_counter() - loop_started})
        if run.checkpointer.step_done(done, run.metrics.write, also=run.clock.due(dist)):
            run.clock.saved()
    if start < spec.total_steps:
        result = final_eval(run.engine, spec, dist, run.pad_id, run.reference.get("eval"))
        run.metrics.write({"event": "final_eval", "step": spec.total_steps, **result})
    run.checkpointer.finish(run.metrics.write)


def one_step(
    run: Run, spec: Spec, dist: Dist, step: int, objective: Objective, loss_head: LossHead
) -> tuple[StepStats, dict[str, float], float]:
    """Optimizer step `step` (0-based) of the objective: (its stats, the objective's own step metrics, this rank's
    seconds to read and batch its rows)."""
    started = time.perf_counter()
    if objective.name == "sft":
        batches = step_batches(run, spec, dist, step)
        data_s = time.perf_counter() - started
        return train_step(run.engine, batches, dist, run.heartbeat, step + 1, loss_head), {}, data_s
    units = step_batches(run, spec, dist, step, rank_preference_batches)
    data_s = time.perf_counter() - started
    table = run.reference.get("train")
    stats, extra = preference_step(run.engine, units, dist, run.heartbeat, step + 1, objective, table)
    return stats, extra, data_s


def full_reference(engine: Any, spec: Spec, dist: Dist, pad_id: int) -> dict[str, ReferenceTable]:
    """Full fine-tuning's dpo/ipo reference log-probabilities of each non-empty split, from the run directory or
    computed by the engine's model as loaded (trainer/reference_table.py); none for other methods and objectives."""
    train = spec.config.train
    if train.method != "full" or not Objective.of(train).needs_reference:
        return {}
    engine.eval()  # the reference has no dropout
    tables = {}
    for split in ("train", "eval"):
        rows = split_of(spec, split)
        if len(rows):
            lockstep = zero_stage(spec.deepspeed) == 3
            batching = {"batch_size": train.micro_batch_size, "pad_id": pad_id, "lockstep": lockstep}
            cache = cache_root(spec.config.launch.node_cache_dir)  # where a table on S3 is copied to be mapped
            tables[split] = load_or_compute(engine, spec.run, split, rows, dist, cache, **batching)
    engine.train()
    return tables


def step_batches(
    run: Run, spec: Spec, dist: Dist, step: int, deal: Callable[..., Iterator[Any]] = rank_micro_batches
) -> list[Any]:
    """This rank's micro-batches of optimizer step `step` (0-based), dealt by `deal`: supervised rows
    (`rank_micro_batches`) or preference units (`rank_preference_batches`), which take the same arguments."""
    train_cfg = spec.config.train
    return list(
        deal(
            run.examples,
            run.order,
            step=step,
            micro=train_cfg.micro_batch_size,
            accum=spec.config.accumulation_steps(dist.world_size),
            rank=dist.rank,
            world=dist.world_size,
            pad_id=run.pad_id,
            group_by_length=train_cfg.length_grouping,
        )
    )


def check_rows(rows: Split, objective: Objective) -> None:
    """The objective fits the staged rows: preference rows for a preference objective, pairs or KTO answers as it
    takes, supervised rows for sft."""
    if not len(rows):
        return
    if rows.preference != (objective.name != "sft"):
        raise UserError(
            f"train.objective={objective.name} and the staged dataset disagree: it holds "
            f"{'preference' if rows.preference else 'supervised'} rows; stage it with data.preference="
            f"{'pairs' if objective.name != 'sft' else 'refuse or chosen'}"
        )
    if rows.preference and (rows.feedback(0) == PAIR) == (objective.name == "kto"):
        held = "pairs" if rows.feedback(0) == PAIR else "KTO feedback (answers labelled true or false)"
        fix = "dpo, ipo or orpo" if held == "pairs" else "kto"
        raise UserError(f"train.objective={objective.name}: the dataset holds {held}; set train.objective to {fix}")


def step_record(engine: Any, stats: StepStats, done: int, total: int, elapsed: float, data_s: float) -> dict[str, Any]:
    """The metrics.jsonl line of a logged step (`data_s`: this rank's time to read and batch the step's rows)."""
    return {
        "step": done,
        "max_steps": total,
        "loss": stats.loss,
        "lr": engine.get_lr()[0],
        "grad_norm": float(engine.get_global_grad_norm() or 0.0),
        "target_tokens": stats.target_tokens,
        "tokens": stats.tokens,
        "tokens_per_s": stats.tokens / elapsed,
        "step_time_s": elapsed,
        "data_time_s": data_s,
        "padding_fraction": stats.padding_fraction,
        **peak_device_memory(),
    }


def split_of(spec: Spec, split: str) -> Split:
    """A split of the spec's dataset as this rank reads it (in place, or the node cache's copy)."""
    return open_split(spec.dataset_dir, split, node_cache(spec.config.launch), spec.dataset.manifest_digest)


def final_eval(engine: Any, spec: Spec, dist: Dist, pad_id: int, table: ReferenceTable | None = None) -> dict[str, Any]:
    """Eval metrics of the in-memory trained model on eval.final_eval_rows rows of the eval split (the exported model
    must reproduce them on the same rows: trainer/evaluate.py sample_rows); `table`: full fine-tuning's reference."""
    engine.eval()
    examples = split_of(spec, "eval")
    objective = Objective.of(spec.config.train)
    if objective.name != "sft":
        result = preference_eval(
            engine,
            examples,
            sample_rows(len(examples), spec.config.eval.final_eval_rows),
            objective,
            dist,
            batch_size=spec.config.eval.batch_size,
            pad_id=pad_id,
            lockstep=zero_stage(spec.deepspeed) == 3,
            table=table,
        )
        engine.train()
        return result
    sums = local_sums(
        engine,
        examples,
        sample_rows(len(examples), spec.config.eval.final_eval_rows),
        rank=dist.rank,
        world=dist.world_size,
        batch_size=spec.config.eval.batch_size,
        pad_id=pad_id,
        device=dist.device,
        lockstep=zero_stage(spec.deepspeed) == 3,
        loss_chunk_tokens=spec.config.train.loss_chunk_tokens,
    )
    engine.train()
    return reduced_metrics(sums, dist)
