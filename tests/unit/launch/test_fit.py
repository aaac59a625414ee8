"""The preflight's memory check against the plan (launch/fit.py `check_fit`): a GPU or a host too small for the
plan refused naming the largest term, a fit within the plan's error passed, and a warning when told to train anyway."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from config.deepspeed import read_deepspeed_json, resolve_from_train
from config.loader import load_config
from config.memory_plan import GB, PLAN_ERROR
from core.errors import UserError
from launch.fit import check_fit
from launch.job import NodePlan
from storage.spec import Spec
from tests.benchmarks.bench_gpu import shape_of
from tests.unit.config.test_memory_plan import FULL_1_5B, qwen_dir


def spec_for(overrides: list[str], model_dir: Path) -> Spec:
    """The three fields check_fit reads, as the written spec has them."""
    cfg = load_config(None, overrides)
    ds = resolve_from_train(read_deepspeed_json(cfg.deepspeed.config), cfg.train, cfg.world_size)
    return cast(Spec, SimpleNamespace(config=cfg, deepspeed=ds, model_path=str(model_dir)))


PLENTY = lambda: int(1000 * GB)  # noqa: E731 - host memory to spare: only the GPU is checked


NODE = NodePlan(node_rank=1, nnodes=2, nproc_per_node=8, master_addr="10.0.0.1", master_port=29500)


def test_preflight_refuses_a_gpu_too_small_naming_the_largest_term(tmp_path: Path) -> None:
    spec = spec_for([*FULL_1_5B, "train.micro_batch_size=8"], qwen_dir(tmp_path, "1.5b"))
    with pytest.raises(UserError) as caught:
        check_fit(spec, NODE, gpu_free_bytes=int(10 * GB), available=PLENTY)
    message = str(caught.value)
    assert message.startswith("node 1: GPU memory: the plan needs ")
    assert "largest term: activations" in message and "train.gradient_checkpointing=true" in message
    assert "launch.require_fit=false trains anyway" in message and "\n" not in message


def test_preflight_passes_within_the_plans_error_and_warns_when_told_to_train_anyway(tmp_path: Path, caplog) -> None:
    model = qwen_dir(tmp_path, "1.5b")
    spec = spec_for([*FULL_1_5B, "train.micro_batch_size=1"], model)
    from config.memory_plan import plan as make

    need = make(spec.config, spec.deepspeed, shape_of("1.5b"), on_gpu=True)
    assert need is not None
    # Less than the plan, but not beyond its error: it trains.
    fits = check_fit(spec, NODE, gpu_free_bytes=int(need.device_bytes * (1 - PLAN_ERROR / 2)), available=PLENTY)
    assert "GB free" in fits and "short" not in fits
    lenient = spec_for([*FULL_1_5B, "train.micro_batch_size=1", "launch.require_fit=false"], model)
    report = check_fit(lenient, NODE, gpu_free_bytes=int(need.device_bytes / 4), available=PLENTY)
    assert report.endswith("short: launch.require_fit=false")
    assert "launch.require_fit=false trains anyway" in caplog.text


def test_preflight_refuses_a_node_whose_host_memory_cannot_load_the_model(tmp_path: Path) -> None:
    """8 ranks each loading the whole 1.5B model in bf16, on a node with 16 GB available."""
    spec = spec_for([*FULL_1_5B, "train.micro_batch_size=1"], qwen_dir(tmp_path, "1.5b"))
    with pytest.raises(UserError, match=r"^node 1: host memory for 8 ranks: the plan needs .* 16\.0 GB free"):
        check_fit(spec, NODE, gpu_free_bytes=int(80 * GB), available=lambda: int(16 * GB))
