"""`python -m flows.finetune --plan`: the memory and disk plan of a config, printed without running anything but the
built-in model's materialization (docs/memory-plan.md)."""

from __future__ import annotations

import tempfile

from config.deepspeed import read_deepspeed_json, resolve_from_train
from config.footprint import Footprint, estimate, read_model_json, staged_on_node
from config.memory_plan import PLAN_ERROR, plan, table
from config.schema import FinetuneConfig
from core.errors import UserError
from pipeline.models import resolve_model
from storage import layout
from storage.full import human_bytes
from storage.location import is_local
from storage.node_cache import cache_root


def plan_text(cfg: FinetuneConfig, *, on_gpu: bool) -> str:
    """The plan of `cfg` on GPU ranks (bf16) or CPU ranks (fp32), and what it writes, as text."""
    model_path = resolve_model(cfg)
    model = read_model_json(model_path)
    if model is None:
        raise UserError(
            f"model.name_or_path {model_path}: no readable config.json for the plan; give a local model directory"
        )
    ds = resolve_from_train(read_deepspeed_json(cfg.deepspeed.config), cfg.train, cfg.world_size)
    memory = plan(cfg, ds, model, on_gpu=on_gpu)
    if memory is None:
        raise UserError(f"model.name_or_path {model_path}: config.json is not a shape the plan knows")
    ranks = f"{cfg.launch.nnodes} node(s) x {cfg.launch.nproc_per_node} rank(s), {cfg.train.method}"
    lines = [
        f"memory plan, {'GPU ranks (bf16)' if on_gpu else 'CPU ranks (float32)'}: {ranks}, "
        f"{cfg.deepspeed.config}; the plan's stated error: {PLAN_ERROR:.0%}",
        table(memory),
    ]
    footprint = estimate(cfg, model, cfg.train.max_steps or cfg.train.save_steps, cfg.world_size, bf16=on_gpu)
    if footprint is not None:
        kept = (
            f"{cfg.train.keep_latest_k} + 1 kept while a new one completes"
            if cfg.train.keep_latest_k is not None
            else "every save kept (train.keep_latest_k unset)"
        )
        lines.append(
            f"run.storage: a checkpoint {human_bytes(footprint.checkpoint)} ({kept}), the export "
            f"{human_bytes(footprint.export)}"
            + (f", the merged export {human_bytes(footprint.merged)}" if footprint.merged else "")
        )
        lines.append(node_disk(cfg, footprint))
    return "\n".join(line for line in lines if line)


def node_disk(cfg: FinetuneConfig, footprint: Footprint) -> str:
    """What each node writes to its own disk (what preflight's space check counts there, launch/space.py)."""
    staged = [
        staged_on_node(footprint, cfg.launch.nproc_per_node, cfg.world_size, node0=node0) for node0 in (True, False)
    ]
    where = (
        f"each node's disk: in {tempfile.gettempdir()}, its ranks' checkpoint shards staged before upload "
        f"({human_bytes(staged[0])} on node 0 with the export, {human_bytes(staged[1])} on the others)"
        if not is_local(layout.root(cfg.run))
        else "each node's disk: nothing staged (run.storage is a local or shared filesystem, written in place)"
    )
    cache = cache_root(cfg.launch.node_cache_dir)
    return (
        f"{where}; a dataset on remote storage is also copied whole to {cache} (launch.node_cache_dir), as large as "
        "the staged dataset (python -m flows.prepare prints its size)"
    )
