"""The training loop: token-weighted loss across ranks and accumulation, metrics, checkpoints, export."""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from config.deepspeed import resolve_from_runtime, zero_stage
from config.spec import Spec
from trainer.checkpoint import export_final, save_checkpoint
from trainer.data import IGNORE_INDEX, Batch, load_split, rank_micro_batches
from trainer.distributed import Dist, dist_sum
from trainer.metrics import MetricsWriter
from trainer.model import load_base, make_trainable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepStats:
    """One optimizer step, reduced over every rank."""

    loss: float
    target_tokens: int
    tokens: int
    padding_fraction: float


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (the caller passes base seed + rank)."""
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


def train_step(engine: Any, batches: list[Batch], dist: Dist) -> StepStats:
    """Forward/backward every micro-batch so that the gradient is d(total loss / global target tokens)."""
    local_targets = sum(b.target_tokens for b in batches)
    (global_targets,) = dist_sum([local_targets], dist)
    # DeepSpeed divides by the accumulation steps and averages gradients over ranks; undo both so each
    # target token weighs the same whatever the micro-batch, accumulation and world size.
    scale = dist.world_size * len(batches) / max(global_targets, 1.0)
    loss_sum, tokens, pads, positions = 0.0, 0, 0, 0
    for batch in batches:
        loss = summed_loss(engine, batch, dist.device)
        engine.backward(loss * scale)
        engine.step()
        loss_sum += loss.item()
        pad, total = batch.padding
        pads, positions, tokens = pads + pad, positions + total, tokens + total - pad
    total_loss, total_tokens, total_pads, total_positions = dist_sum([loss_sum, tokens, pads, positions], dist)
    return StepStats(total_loss / max(global_targets, 1.0), int(global_targets), int(total_tokens),
                     total_pads / max(total_positions, 1.0))


def build_engine(spec: Spec, dist: Dist) -> tuple[Any, int]:
    """(DeepSpeed engine, pad token id) for the spec's model and method."""
    import deepspeed
    from transformers import get_scheduler

    train = spec.config.train
    bf16 = dist.device.type == "cuda"
    model = make_trainable(load_base(spec.model_path, method=train.method, bf16=bf16), train)
    ds = resolve_from_runtime(spec.deepspeed, bf16=bf16, hidden_size=model.config.hidden_size)
    # Each rank saves under its own tag (rank-{r}); DeepSpeed's cross-rank tag check would flag that.
    ds.setdefault("checkpoint", {})["tag_validation"] = "Ignore"
    warmup = int(np.ceil(train.warmup_ratio * train.max_steps))

    def scheduler(optimizer: Any) -> Any:
        return get_scheduler(train.lr_scheduler, optimizer, num_warmup_steps=warmup, num_training_steps=train.max_steps)

    params = [p for p in model.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds, lr_scheduler=scheduler)
    return engine, int(model.config.pad_token_id)


def train(spec: Spec, dist: Dist) -> None:
    """Run train.max_steps optimizer steps, logging, checkpointing and exporting as configured."""
    cfg = spec.config
    train_cfg = cfg.train
    seed_everything(train_cfg.seed + dist.rank)
    engine, pad_id = build_engine(spec, dist)
    examples = load_split(spec.dataset.url, "train")
    metrics = MetricsWriter(spec.run_url, enabled=dist.is_main)
    stage = zero_stage(spec.deepspeed)
    meta = {"zero_stage": stage, "method": train_cfg.method}
    log.info("training %d examples for %d steps on %d ranks", len(examples), train_cfg.max_steps, dist.world_size)
    for step in range(train_cfg.max_steps):
        started = time.perf_counter()
        batches = list(rank_micro_batches(
            examples, seed=train_cfg.seed, step=step, micro=train_cfg.micro_batch_size,
            accum=train_cfg.gradient_accumulation_steps, rank=dist.rank, world=dist.world_size, pad_id=pad_id,
        ))
        stats = train_step(engine, batches, dist)
        elapsed = time.perf_counter() - started
        done = step + 1
        if done % train_cfg.log_steps == 0 or done == train_cfg.max_steps:
            metrics.write({
                "step": done, "max_steps": train_cfg.max_steps, "loss": stats.loss,
                "lr": engine.get_lr()[0], "grad_norm": float(engine.get_global_grad_norm() or 0.0),
                "target_tokens": stats.target_tokens, "tokens": stats.tokens,
                "tokens_per_s": stats.tokens / elapsed, "step_time_s": elapsed,
                "padding_fraction": stats.padding_fraction,
            })
        if done % train_cfg.save_steps == 0 or done == train_cfg.max_steps:
            save_checkpoint(engine, run_url=spec.run_url, step=done, meta=meta, dist=dist,
                            algorithm=cfg.data.digest_algorithm)
    export_final(engine, run_url=spec.run_url, model_path=spec.model_path, zero_stage=stage, dist=dist)
