"""Planning a run: its identity (`new_run_id`) and its resolution into the spec every node and rank reads
(`build_spec`: world size, DeepSpeed "auto" values, total steps, absolute locations). Free of Prefect, so that what
builds a spec without it (the GPU benchmark on a machine without Prefect) can."""

from __future__ import annotations

import json
import math
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from config.chat_template import resolve_chat_template
from config.deepspeed import ModelShape, read_deepspeed_json, resolve_from_model, resolve_from_train, zero_stage
from config.objectives import PROMPT_DATA
from config.schema import FinetuneConfig
from config.sections.model_train import TrainConfig
from core.checkout import code_version
from core.errors import UserError
from storage import layout
from storage.base_model import record_base_model
from storage.manifest import read_manifest
from storage.node_cache import cache_root
from storage.rewards import RewardRef, stage_rewards
from storage.shards import split_rows
from storage.spec import DatasetRef, Spec


def new_run_id(cfg: FinetuneConfig) -> str:
    """run.name when set (re-running it continues that run), else time + a short random suffix."""
    if cfg.run.name:
        return cfg.run.name
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def total_steps(train: TrainConfig, train_records: int, world_size: int) -> int:
    """train.max_steps when set, else enough steps for train.epochs passes over the train split."""
    if train.max_steps is not None:
        return train.max_steps
    # With train.global_batch_size the rows per step, hence the step count and the schedule, ignore the world size.
    per_step = train.global_batch_size or train.micro_batch_size * train.gradient_accumulation_steps * world_size
    if train.objective.data == PROMPT_DATA:  # grpo: a step's rows are completions, G a prompt, each window mu steps
        prompts = max(per_step // train.rl.num_generations, 1)
        return max(1, math.ceil(train.epochs * train_records / prompts)) * train.rl.num_iterations
    return max(1, math.ceil(train.epochs * train_records / per_step))


def record_model(cfg: FinetuneConfig, run_id: str, model_path: str) -> str:
    """Write the run's base_model.json (the model's files, sizes and digests, from this machine's copy) for every
    node's preflight to check its copy against; returns its digest, which the spec and the lineage carry."""
    run = layout.run_dir(cfg.run, run_id)
    return record_base_model(run, model_path, cfg.data.digest_algorithm, cache_root(cfg.launch.node_cache_dir))


def model_shape(model_path: str) -> ModelShape | None:
    """The model's shape from its config.json (None without one: the ranks then resolve the sizes themselves)."""
    path = Path(model_path) / "config.json"
    if not path.is_file():
        return None
    return ModelShape.of(json.loads(path.read_text(encoding="utf-8")))


def build_spec(
    cfg: FinetuneConfig,
    run_id: str,
    model_path: str,
    dataset: DatasetRef,
    model_manifest_digest: str | None = None,
    rewards: list[RewardRef] | None = None,
) -> Spec:
    """Resolve the config once: world size, DeepSpeed "auto" values, total steps, the run's location (run.storage with
    its options: every node and rank reaches the run through it); with the digest of the run's base_model.json
    (record_model) when it was recorded. Online RL's reward files are staged under run.storage here (storage/rewards.py)
    unless `rewards` gives them (an elastic attempt keeps its run's)."""
    ds = resolve_from_train(read_deepspeed_json(cfg.deepspeed.config), cfg.train, cfg.world_size)
    check_reference(cfg, ds)
    if (shape := model_shape(model_path)) is not None:
        ds = resolve_from_model(ds, shape)
    train_records = dataset.records("train")
    if train_records is None:  # a reference read back from spec.json carries no counts
        staged = dataset.location(layout.root(cfg.run))
        train_records = split_rows(read_manifest(staged, layout.DATASET_SCHEMAS)[0]["splits"]["train"])
    steps = total_steps(cfg.train, train_records, cfg.world_size)
    return Spec(
        run_id=run_id,
        run=layout.run_dir(cfg.run, run_id),
        config=cfg,
        deepspeed=ds,
        world_size=cfg.world_size,
        total_steps=steps,
        model_path=model_path,
        dataset=dataset,
        model_manifest_digest=model_manifest_digest,
        code_version=code_version(),
        chat_template=resolve_chat_template(cfg.model.chat_template),
        rewards=rewards if rewards is not None else run_rewards(cfg),
    )


def check_reference(cfg: FinetuneConfig, ds: dict[str, Any]) -> None:
    """Online RL with beta > 0 under full fine-tuning keeps a frozen copy of the base beside the policy: refused under
    ZeRO-3, whose partitioned policy is there because the whole model does not fit a rank."""
    train = cfg.train
    frozen_copy = train.rl.beta > 0 and not train.method.trains_adapters
    if train.objective.data == PROMPT_DATA and frozen_copy and zero_stage(ds) == 3:
        raise UserError(
            f"train.rl.beta={train.rl.beta:g} with train.method=full under ZeRO-3: the reference would be a whole "
            "frozen copy of the base on every rank beside the partitioned policy; use train.method lora or qlora "
            "(the reference is the adapters disabled), ZeRO-2, or train.rl.beta=0"
        )


def run_rewards(cfg: FinetuneConfig) -> list[RewardRef]:
    """A grpo run's reward functions, each file staged under run.storage; none for other objectives."""
    if cfg.train.objective.data != PROMPT_DATA:
        return []
    return stage_rewards(cfg.train.rl.parsed_rewards, layout.root(cfg.run))
