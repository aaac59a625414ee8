"""The training loop: the run's objective (trainer/objectives/) one optimizer step at a time, metrics, the watches;
checkpoints and the export through the checkpointer (trainer/checkpointing/policy.py)."""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from config.deepspeed import ModelShape, resolve_from_runtime, zero_stage
from storage.node_cache import cache_root
from storage.spec import Spec
from storage.split_reader import Split
from trainer.checkpointing.policy import Checkpointer, DeepSpeedIO, Policy
from trainer.data import GlobalOrder, split_of
from trainer.evaluation.stage import sample_rows
from trainer.metrics import MetricsWriter, StepStats, log_memory, peak_device_memory
from trainer.model import attention, compiled, kernels, tiled_mlp
from trainer.model.cuda_build import plain_arch_list
from trainer.model.lean_imports import import_muon_uncompiled_unless_configured
from trainer.model.load import (
    PartitionedLoad,
    ensure_pad_token_id,
    load_base,
    make_trainable,
    model_config,
    partitioned_load,
)
from trainer.objectives.base import TrainObjective, check_rows
from trainer.objectives.registry import build
from trainer.parallel import sequence_parallel
from trainer.parallel.distributed import Dist
from trainer.parallel.moe import set_zero3_leaves
from trainer.prefetch import StepPrefetcher
from trainer.step import optimizer_step
from trainer.watch import faults, guards
from trainer.watch.cancel import EXIT_CANCELLED, CancelWatch, SaveClock
from trainer.watch.heartbeat import Heartbeat
from trainer.watch.profiler import StepProfiler
from trainer.watch.straggler import StragglerWatch

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def load_model(spec: Spec, dist: Dist, *, bf16: bool, zero3: bool) -> Any:
    """The base model (trainer/model/load.py `load_base`) computing attention as train.attention resolves on this
    rank."""
    train = spec.config.train
    supervised = not train.objective.data.preference_rows  # preference rows are never flattened
    attn = attention.resolve(train.attention, dist.device, dist.sequence_parallel, supervised=supervised)
    base = load_base(
        spec.model_path,
        method=train.method,
        bf16=bf16,
        zero3=zero3,
        trust_remote_code=spec.config.model.trust_remote_code,
        # sdpa is transformers' default, and a model whose own code has no sdpa path falls back to eager there.
        attention=None if attn is attention.Attention.SDPA else attn.value,
    )
    attention.announce(attn)
    return base


def build_engine(spec: Spec, dist: Dist) -> tuple[Any, int, PartitionedLoad | None]:
    """(DeepSpeed engine, pad token id, the partitioned load to keep alive under ZeRO-3) for the spec's model and
    method."""
    import deepspeed
    from transformers import get_scheduler

    train = spec.config.train
    remote = spec.config.model.trust_remote_code
    fused = kernels.resolve(train.kernels, dist.device)  # before the model loads: a kernel that cannot run stops here
    bf16 = dist.device.type == "cuda"
    if bf16:
        plain_arch_list()
    shape = ModelShape.of(model_config(spec.model_path, trust_remote_code=remote))
    ds = resolve_from_runtime(spec.deepspeed, bf16=bf16, shape=shape)
    # Each rank saves under its own tag (rank-{r}); DeepSpeed's cross-rank tag check would flag that.
    ds.setdefault("checkpoint", {})["tag_validation"] = "Ignore"
    seed_everything(train.seed)  # the same initial weights (LoRA's random A) on every rank
    partitioned = partitioned_load(ds, train.method, spec.config.deepspeed.zero3_init)
    log_memory("before loading the model")
    base = load_model(spec, dist, bf16=bf16, zero3=zero_stage(ds) == 3)
    sequence_parallel.check_attention(base, dist.sequence_parallel)
    log_memory("model loaded" + (" (partitioned by ZeRO-3)" if partitioned else ""))
    pad_id = ensure_pad_token_id(base, spec.model_path, trust_remote_code=remote)
    kernels.announce(base, fused)  # on the transformers model, before PEFT wraps it
    model = make_trainable(base, train)
    faults.maybe_force_disjoint_routing(model, dist.rank)
    set_zero3_leaves(model, zero_stage(ds))
    if train.tiled_mlp:
        tiled_mlp.tile_mlps(model)
    if train.compile:
        compiled.compile_layers(model, cache_root(spec.config.launch.node_cache_dir))
    warmup = math.ceil(train.warmup_ratio * spec.total_steps)

    def scheduler(optimizer: Any) -> Any:
        return get_scheduler(
            train.lr_scheduler, optimizer, num_warmup_steps=warmup, num_training_steps=spec.total_steps
        )

    params = [p for p in model.parameters() if p.requires_grad]
    import_muon_uncompiled_unless_configured(ds)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=params, config=ds, lr_scheduler=scheduler, mpu=sequence_parallel.groups(dist)
    )
    log_memory("engine built")
    return engine, pad_id, partitioned


@dataclass
class Run:
    """What the step loop works with besides the spec: the engine, the objective, and everything that watches or
    records a step."""

    engine: Any
    pad_id: int
    objective: TrainObjective
    examples: Split
    order: GlobalOrder
    metrics: MetricsWriter
    straggler: StragglerWatch
    heartbeat: Heartbeat
    checkpointer: Checkpointer
    cancel: CancelWatch
    clock: SaveClock
    partitioned: PartitionedLoad | None = None  # kept alive for the run (ZeRO-3): see trainer/model/load.py
    prefetch: StepPrefetcher | None = None  # the next step's micro-batches, dealt while this one runs


def start_run(spec: Spec, dist: Dist) -> tuple[Run, int]:
    """Build the engine and the objective, resume (train.resume), and set up metrics and the watches; returns (run,
    first step)."""
    train_cfg = spec.config.train
    objective = build(train_cfg)
    examples = split_of(spec, "train")
    check_rows(examples, objective.objective)  # before the model loads: rows staged for another objective stop here
    engine, pad_id, partitioned = build_engine(spec, dist)
    objective.start(engine, spec, dist, pad_id)  # by the base (a reference table): before any checkpoint is resumed
    seed_everything(train_cfg.seed + dist.rank)  # per-rank streams (dropout); restored on resume
    io = DeepSpeedIO(engine, spec, dist, zero_stage=zero_stage(spec.deepspeed))
    checkpointer = Checkpointer(
        io, Policy(train_cfg.save_steps, spec.total_steps, train_cfg.keep_latest_k), is_main=dist.is_main
    )
    start = checkpointer.resume()
    metrics = MetricsWriter(spec.run, enabled=dist.is_main, start_step=start)
    order = GlobalOrder(len(examples), train_cfg.seed)
    order.epoch(start * spec.config.global_batch(dist.world_size) // max(len(examples), 1))  # before the first step
    run = Run(
        engine,
        pad_id,
        objective,
        examples,
        order,
        metrics,
        StragglerWatch(train_cfg.straggler_check_steps, train_cfg.straggler_factor, dist),
        Heartbeat(dist.rank),
        checkpointer,
        CancelWatch(spec.config.launch.checkpoint_on_cancel or bool(train_cfg.preempt_grace_s)),
        SaveClock(train_cfg.save_every_minutes),
        partitioned,
    )
    return run, start


def train(spec: Spec, dist: Dist) -> None:
    """Run the spec's optimizer steps (resuming if asked), logging, checkpointing and exporting."""
    dist = sequence_parallel.start(spec, dist)
    run, start = start_run(spec, dist)
    log.info(
        "training %d rows (%d examples) with %s, steps %d..%d on %d ranks",
        len(run.examples),
        run.examples.examples,
        run.objective.objective,
        start + 1,
        spec.total_steps,
        dist.world_size,
    )
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
            stats, extra, data_s = one_step(run, spec, dist, step)
        elapsed, done = time.perf_counter() - started, step + 1
        if step == start and spec.config.train.compile:
            log.info("train.compile: the first step took %.1f s, compiling the decoder layers included", elapsed)
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
    if run.prefetch is not None:
        run.prefetch.close()
    if start < spec.total_steps:
        result = final_eval(run, spec, dist)
        run.metrics.write({"event": "final_eval", "step": spec.total_steps, **result})
    run.checkpointer.finish(run.metrics.write)


def one_step(run: Run, spec: Spec, dist: Dist, step: int) -> tuple[StepStats, dict[str, float], float]:
    """Optimizer step `step` (0-based) of the objective: (its stats, the objective's own step metrics, this rank's
    seconds waiting for its rows to be read and batched: dealt while the step before ran, it is near 0)."""
    started = time.perf_counter()
    if run.prefetch is None:
        run.prefetch = StepPrefetcher(
            lambda s: deal_step(run, spec, dist, s), spec.total_steps, pin=dist.device.type == "cuda"
        )
    batches = run.prefetch.batches(step)
    data_s = time.perf_counter() - started
    stats, extra = optimizer_step(run.engine, batches, dist, run.heartbeat, step + 1, run.objective)
    return stats, extra, data_s


def deal_step(run: Run, spec: Spec, dist: Dist, step: int) -> list[Any]:
    """This rank's micro-batches of optimizer step `step` (0-based), each cut to its part with sequence parallelism."""
    train_cfg = spec.config.train
    batches = run.objective.deal(
        run.examples,
        run.order,
        step=step,
        micro=train_cfg.micro_batch_size,
        accum=spec.config.accumulation_steps(dist.world_size),
        rank=dist.data_rank,  # the ranks of a sequence group read the same rows, each its part of them
        world=dist.data_world,
        pad_id=run.pad_id,
        group_by_length=train_cfg.length_grouping,
    )
    return [sequence_parallel.shard(batch, dist) for batch in batches]


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


def final_eval(run: Run, spec: Spec, dist: Dist) -> dict[str, Any]:
    """The objective's eval metrics of the in-memory trained model on eval.final_eval_rows rows of the eval split (the
    exported model must reproduce them on the same rows: trainer/evaluation/stage.py sample_rows)."""
    run.engine.eval()
    examples = split_of(spec, "eval")
    result = run.objective.evaluate(
        run.engine,
        examples,
        sample_rows(len(examples), spec.config.eval.final_eval_rows),
        dist,
        batch_size=spec.config.eval.batch_size,
        pad_id=run.pad_id,
        lockstep=zero_stage(spec.deepspeed) == 3,
    )
    run.engine.train()
    return result
