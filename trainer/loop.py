"""The training loop: token-weighted loss across ranks and accumulation, metrics, checkpoints, export."""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from config.deepspeed import resolve_from_runtime, zero_stage
from storage.spec import Spec
from trainer import faults, guards
from trainer.cancel import EXIT_CANCELLED, CancelWatch
from trainer.checkpoint import apply_retention, export_final, save_checkpoint
from trainer.data import IGNORE_INDEX, Batch, load_split, rank_micro_batches
from trainer.distributed import Dist, dist_sum
from trainer.evaluate import local_sums, reduced_metrics
from trainer.heartbeat import Heartbeat
from trainer.metrics import MetricsWriter
from trainer.model import load_base, make_trainable
from trainer.resume import check_compatible, choose_checkpoint, load_checkpoint
from trainer.straggler import StragglerWatch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepStats:
    """One optimizer step, reduced over every rank, plus this rank's compute time."""

    loss: float
    target_tokens: int
    tokens: int
    padding_fraction: float
    compute_s: float


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def summed_loss(engine: Any, batch: Batch, device: torch.device) -> torch.Tensor:
    """Cross-entropy summed over the predicted positions of a micro-batch (labels shifted by one)."""
    out = engine(input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device))
    logits = out.logits[:, :-1, :].float()
    targets = batch.labels[:, 1:].to(device)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE_INDEX,
                           reduction="sum")


def train_step(engine: Any, batches: list[Batch], dist: Dist, heartbeat: Heartbeat, step: int) -> StepStats:
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
        loss = faults.maybe_poison(summed_loss(engine, batch, dist.device), dist.rank, step)
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
    return StepStats(total_loss / max(global_targets, 1.0), int(global_targets), int(total_tokens),
                     total_pads / max(total_positions, 1.0), compute_s)


def build_engine(spec: Spec, dist: Dist) -> tuple[Any, int]:
    """(DeepSpeed engine, pad token id) for the spec's model and method."""
    import deepspeed
    from transformers import get_scheduler

    train = spec.config.train
    bf16 = dist.device.type == "cuda"
    seed_everything(train.seed)  # the same initial weights (LoRA's random A) on every rank
    model = make_trainable(load_base(spec.model_path, method=train.method, bf16=bf16), train)
    ds = resolve_from_runtime(spec.deepspeed, bf16=bf16, hidden_size=model.config.hidden_size)
    # Each rank saves under its own tag (rank-{r}); DeepSpeed's cross-rank tag check would flag that.
    ds.setdefault("checkpoint", {})["tag_validation"] = "Ignore"
    warmup = math.ceil(train.warmup_ratio * spec.total_steps)

    def scheduler(optimizer: Any) -> Any:
        return get_scheduler(train.lr_scheduler, optimizer, num_warmup_steps=warmup,
                             num_training_steps=spec.total_steps)

    params = [p for p in model.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds, lr_scheduler=scheduler)
    return engine, int(model.config.pad_token_id)


def train(spec: Spec, dist: Dist) -> None:
    """Run the spec's optimizer steps (resuming if asked), logging, checkpointing and exporting."""
    cfg, train_cfg = spec.config, spec.config.train
    engine, pad_id = build_engine(spec, dist)
    stage, adapters = zero_stage(spec.deepspeed), train_cfg.method != "full"
    seed_everything(train_cfg.seed + dist.rank)  # per-rank streams (dropout); restored on resume
    start = 0
    ckpt = choose_checkpoint(train_cfg.resume, spec.run_url, dist)
    if ckpt is not None:
        check_compatible(ckpt, world_size=dist.world_size, zero_stage=stage, method=train_cfg.method)
        start = load_checkpoint(engine, ckpt, dist, frozen_excluded=adapters)
    examples = load_split(spec.dataset.url, "train")
    metrics = MetricsWriter(spec.run_url, enabled=dist.is_main, start_step=start)
    watch = StragglerWatch(train_cfg.straggler_check_steps, train_cfg.straggler_factor, dist)
    heartbeat = Heartbeat(dist.rank)
    meta = {"zero_stage": stage, "method": train_cfg.method}
    log.info("training %d examples, steps %d..%d on %d ranks", len(examples), start + 1, spec.total_steps,
             dist.world_size)
    cancel = CancelWatch(cfg.launch.checkpoint_on_cancel)
    for step in range(start, spec.total_steps):
        if cancel.should_stop(dist):
            if step > start and step % train_cfg.save_steps != 0:  # the state after `step` steps is not saved yet
                save_checkpoint(engine, run_url=spec.run_url, step=step, meta=meta, dist=dist,
                                algorithm=cfg.data.digest_algorithm, exclude_frozen=adapters)
            log.warning("cancelled: stopped after step %d with a complete checkpoint", step)
            raise SystemExit(EXIT_CANCELLED)
        faults.maybe_exit(dist.rank, step + 1)
        started = time.perf_counter()
        batches = list(rank_micro_batches(
            examples, seed=train_cfg.seed, step=step, micro=train_cfg.micro_batch_size,
            accum=train_cfg.gradient_accumulation_steps, rank=dist.rank, world=dist.world_size, pad_id=pad_id,
            group_by_length=train_cfg.length_grouping,
        ))
        with guards.out_of_memory_named(dist, step + 1):
            stats = train_step(engine, batches, dist, heartbeat, step + 1)
        elapsed, done = time.perf_counter() - started, step + 1
        guards.check_loss(stats.loss, done)
        watch.observe(stats.compute_s)
        for event in watch.check(done):
            metrics.write(event)
        if done % train_cfg.log_steps == 0 or done == spec.total_steps:
            metrics.write({
                "step": done, "max_steps": spec.total_steps, "loss": stats.loss,
                "lr": engine.get_lr()[0], "grad_norm": float(engine.get_global_grad_norm() or 0.0),
                "target_tokens": stats.target_tokens, "tokens": stats.tokens,
                "tokens_per_s": stats.tokens / elapsed, "step_time_s": elapsed,
                "padding_fraction": stats.padding_fraction,
            })
        if done % train_cfg.save_steps == 0 or done == spec.total_steps:
            saving = time.perf_counter()
            _, size = save_checkpoint(engine, run_url=spec.run_url, step=done, meta=meta, dist=dist,
                                      algorithm=cfg.data.digest_algorithm, exclude_frozen=adapters)
            metrics.write({"event": "checkpoint", "step": done, "bytes": size,
                           "seconds": time.perf_counter() - saving})
            if dist.is_main:
                apply_retention(spec.run_url, train_cfg.keep_latest_k)
    if start < spec.total_steps:
        metrics.write({"event": "final_eval", "step": spec.total_steps, **final_eval(engine, spec, dist, pad_id)})
    export_final(engine, run_url=spec.run_url, model_path=spec.model_path, step=spec.total_steps, zero_stage=stage,
                 merged=train_cfg.export_merged, dist=dist)


def final_eval(engine: Any, spec: Spec, dist: Dist, pad_id: int) -> dict[str, Any]:
    """Eval metrics of the in-memory trained model (the exported one must reproduce them)."""
    engine.eval()
    sums = local_sums(engine, load_split(spec.dataset.url, "eval"), rank=dist.rank, world=dist.world_size,
                      batch_size=spec.config.eval.batch_size, pad_id=pad_id, device=dist.device,
                      lockstep=zero_stage(spec.deepspeed) == 3)
    engine.train()
    return reduced_metrics(sums, dist)
