"""`python -m flows.finetune --plan` as text: the memory plan of a config's ranks and what its run writes to storage
and to each node's disk; a model without a shape the plan knows is one line."""

from __future__ import annotations

import pytest

from config.loader import load_config
from core.errors import UserError
from pipeline.memory import plan_text


def test_the_plan_names_the_layout_the_writes_and_the_node_disk(tiny_model, tmp_path) -> None:
    cfg = load_config(None, [f"model.name_or_path={tiny_model}", "train.keep_latest_k=2", f"run.storage={tmp_path}"])
    text = plan_text(cfg, on_gpu=False)
    first = text.splitlines()[0]
    assert first.startswith("memory plan, CPU ranks (float32): 2 node(s) x 1 rank(s), lora, ") and "error: 25%" in first
    assert "run.storage: a checkpoint " in text and "(2 + 1 kept while a new one completes)" in text
    assert "each node's disk: nothing staged (run.storage is a local or shared filesystem, written in place)" in text
    remote = cfg.model_copy(update={"run": cfg.run.model_copy(update={"storage": "s3://bucket/tandem"})})
    assert "its ranks' checkpoint shards staged before upload" in plan_text(remote, on_gpu=True)
    assert plan_text(remote, on_gpu=True).startswith("memory plan, GPU ranks (bf16)")


def test_a_model_without_a_config_json_is_one_line(tmp_path) -> None:
    with pytest.raises(UserError, match=rf"^model.name_or_path {tmp_path}: no readable config.json for the plan"):
        plan_text(load_config(None, [f"model.name_or_path={tmp_path}"]), on_gpu=False)
