"""Models as their publishers ship them, at their real shapes (marker `published`: `make test-suites` runs it, the
default run does not): a directory of Qwen2.5-0.5B-Instruct's full published shape (its config.json without
pad_token_id, tied embeddings, random bf16 weights in model.safetensors, Qwen's tokenizer files from the pinned
package with Qwen2.5's chat template, generation_config.json) trains through the whole pipeline on a small
Alpaca-format set with LoRA under ZeRO-2 (2 nodes) and with full fine-tuning under ZeRO-3 (1 rank: 13.7 GB of host
memory, the most this 24 GB machine holds twice) to registration; and Qwen3-0.6B's published shape (its hidden size,
heads, vocabulary and tying, cut to 2 layers, Qwen's Qwen3 tokenizer files) trains with LoRA and exports.

Nothing is downloaded (no hub is reachable): the weights are random, so what is checked is that the directory
loads, trains, exports, evaluates and registers as shipped, and that the export reproduces the in-memory model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from torch.testing import assert_close

from config.loader import load_config
from tests.published import QWEN3_06B, QWEN3_GENERATION, QWEN25_05B_INSTRUCT, QWEN25_GENERATION, write_published

pytestmark = [pytest.mark.published, pytest.mark.e2e]


def alpaca(n: int) -> list[dict]:
    """Alpaca-format SFT records (instruction, input, output), as LLaMA-Factory's alpaca demo has them."""
    return [
        {
            "instruction": f"Add {i} and {i + 3}.",
            "input": "" if i % 2 else f"Show the sum only (case {i}).",
            "output": f"{i} + {i + 3} = {2 * i + 3}.",
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def qwen25_05b(tmp_path_factory) -> Path:
    """Qwen2.5-0.5B-Instruct as published, with random weights (494M parameters, 988 MB of bf16; about 20 s)."""
    from trainer.model.tiny_qwen import build_qwen25_tokenizer

    out = tmp_path_factory.mktemp("published") / "Qwen2.5-0.5B-Instruct"
    write_published(out, QWEN25_05B_INSTRUCT, QWEN25_GENERATION, build_qwen25_tokenizer())
    assert "pad_token_id" not in json.loads((out / "config.json").read_text())
    return out


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("alpaca") / "alpaca_en_demo.json"
    path.write_text(json.dumps(alpaca(40)))
    return path


def run_pipeline(storage: Path, model: Path, data: Path, name: str, overrides: list[str]) -> dict:
    from flows.finetune import finetune

    return finetune(
        load_config(
            None,
            [
                f"run.storage={storage}",
                f"run.name={name}",
                f"model.name_or_path={model}",
                f"data.source={data}",
                "data.max_length=96",
                "data.eval_ratio=0.1",
                "train.max_steps=2",
                "train.save_steps=2",
                "train.micro_batch_size=1",
                "train.gradient_accumulation_steps=1",
                "eval.batch_size=4",
                "launch.rdzv_timeout=300",
                f"register.model_name={name}",
                *overrides,
            ],
        )
    )


def in_memory_eval(run_url: str) -> dict:
    lines = (Path(run_url) / "metrics.jsonl").read_text().splitlines()
    return next(r for r in map(json.loads, lines) if r.get("event") == "final_eval")


def test_qwen25_05b_as_published_trains_evaluates_and_registers_with_lora_under_zero2(
    prefect_server, tmp_path, qwen25_05b, sft_data
) -> None:
    summary = run_pipeline(tmp_path, qwen25_05b, sft_data, "qwen05-lora", ["launch.nnodes=2"])
    assert summary["registered"], summary["registration"]
    log = (Path(summary["run_url"]) / "nodes" / "0" / "log.txt").read_text()
    assert "config.json has no pad_token_id: padding with the tokenizer's pad token <|endoftext|> (id 151643)" in log
    assert_close(summary["eval"]["loss"], in_memory_eval(summary["run_url"])["loss"], rtol=1e-5, atol=0)


def test_qwen25_05b_as_published_full_finetuning_under_zero3_exports_its_tied_embeddings_once(
    prefect_server, tmp_path, qwen25_05b, sft_data
) -> None:
    summary = run_pipeline(
        tmp_path,
        qwen25_05b,
        sft_data,
        "qwen05-full",
        ["launch.nnodes=1", "train.method=full", "deepspeed.config=config/deepspeed/zero3.json"],
    )
    assert summary["registered"], summary["registration"]
    final = Path(summary["model_url"])
    from safetensors import safe_open

    names = set()
    for shard in final.glob("*.safetensors"):
        with safe_open(shard, "pt") as exported:
            names |= set(exported.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names  # tied: written once
    assert_close(summary["eval"]["loss"], in_memory_eval(summary["run_url"])["loss"], rtol=1e-5, atol=0)


def test_qwen3_shape_trains_and_exports(tmp_path, sft_data) -> None:
    """Qwen3-0.6B's published hidden size, heads, head_dim, vocabulary and tying with 2 layers, Qwen's Qwen3
    tokenizer files (its chat template and <think> tokens): LoRA under ZeRO-2 on 1 rank, trained and exported."""
    from tests.distributed.harness import stage, train
    from trainer.model.tiny_qwen import qwen_tokenizer_dir

    model = write_published(
        tmp_path / "Qwen3-0.6B-2-layers",
        {**QWEN3_06B, "num_hidden_layers": 2, "max_window_layers": 2},
        QWEN3_GENERATION,
        qwen_tokenizer_dir(),
    )
    staged = stage(tmp_path / "storage", str(model), [f"data.source={sft_data}", "data.max_length=96"])
    run = train(staged, "qwen3", ["launch.nnodes=1", "train.max_steps=2", "train.save_steps=2"])
    final = run.run_dir / "final"
    assert (final / "COMPLETE").exists() and (final / "adapter_model.safetensors").exists()
    assert json.loads((final / "adapter_config.json").read_text())["base_model_name_or_path"] == str(model)


def test_qwen3_moe_as_published_lora_on_its_experts_under_zero3_on_2_ranks_exports_adapter_and_merged(
    qwen3_moe, tmp_path, sft_data
) -> None:
    """Qwen3-30B-A3B as published, sizes scaled down (tests/published.py): LoRA on attention and the fused experts
    under ZeRO-3 on 2 ranks, trained, exported as an adapter that names its expert weights and as a merged model in
    the published per-expert layout, which transformers loads; its step-2 checkpoint resumed on 1 rank continues the
    2-rank trajectory (the global batch fixed, one row a micro-batch, so every micro-batch's balancing loss is over
    the same row at either size)."""
    import shutil

    from torch.testing import assert_close
    from transformers import AutoModelForCausalLM

    from tests.distributed.harness import stage, train

    staged = stage(tmp_path / "storage", qwen3_moe, [f"data.source={sft_data}", "data.max_length=96"])
    overrides = ["train.max_steps=4", "train.save_steps=2", "train.global_batch_size=4", "train.micro_batch_size=1"]
    overrides += ["train.lora.dropout=0", "deepspeed.config=config/deepspeed/zero3.json"]
    run = train(staged, "qwen3-moe", [*overrides, "train.export_merged=true"])
    resumed_dir = Path(staged.storage) / "runs" / "qwen3-moe-on-1" / "checkpoints" / run.checkpoint(2).name
    shutil.copytree(run.checkpoint(2), resumed_dir)
    resumed = train(staged, "qwen3-moe-on-1", [*overrides, "launch.nnodes=1"])
    assert_close(resumed.losses(), run.losses()[2:], rtol=1e-5, atol=0)
    log = (resumed.run_dir / "nodes" / "0" / "log.txt").read_text()
    assert "resumed from step 2 written by 2 ranks, now on 1" in log
    final = run.run_dir / "final"
    adapters = json.loads((final / "adapters.json").read_text())
    assert adapters["target_parameters"] == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
    assert 0 < adapters["trainable"] < adapters["total"] / 100
    merged = AutoModelForCausalLM.from_pretrained(final / "merged")
    assert merged.config.model_type == "qwen3_moe"
    steps = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "loss" in s and "event" not in s]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    for step in steps:  # the router's balance, apart from the language model's loss
        assert step["aux_loss"] > 0 and 1.0 <= step["expert_load_max"] <= 8 / 2 and step["experts_idle"] >= 0


def test_qwen3_moe_full_finetuning_under_zero3_trains_on_while_the_ranks_route_to_disjoint_experts(
    qwen3_moe, tmp_path, sft_data
) -> None:
    """Rank 0 routes every token to experts 0-1 and rank 1 to experts 2-3 in every step
    (TANDEM_TEST_DISJOINT_ROUTING), full fine-tuning under ZeRO-3 on 2 ranks: each rank's expert weights are one
    fused parameter, gathered whole whatever it routes to, so no rank waits for a gather the other never makes."""
    from tests.distributed.harness import stage, train

    staged = stage(tmp_path / "storage", qwen3_moe, [f"data.source={sft_data}", "data.max_length=96"])
    overrides = ["train.method=full", "train.max_steps=3", "train.save_steps=3"]
    run = train(
        staged,
        "qwen3-moe-disjoint",
        [*overrides, "deepspeed.config=config/deepspeed/zero3.json"],
        env={"TANDEM_TEST_DISJOINT_ROUTING": "1"},
    )
    steps = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [s["loss"] for s in steps if "loss" in s and "event" not in s]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)
    assert (run.run_dir / "final" / "COMPLETE").exists()
    logs = "".join(path.read_text(errors="replace") for path in (run.run_dir / "nodes").rglob("*") if path.is_file())
    for rank in (0, 1):
        assert f"2 routers of rank {rank} forced to its own experts" in logs


def test_remote_code_moe_with_one_module_per_expert_trains_lora_under_zero3_while_ranks_route_to_disjoint_experts(
    tmp_path, sft_data
) -> None:
    """A remote-code mixture of experts (tests/published.py per_expert_moe_scaled: its config.json's auto_map names the
    modeling file beside the weights, one module per expert) with model.trust_remote_code: LoRA on attention and every
    expert's projections under ZeRO-3 on 2 ranks, rank 0 routing every token to experts 0-1 and rank 1 to experts 2-3
    (TANDEM_TEST_DISJOINT_ROUTING). Only the experts a token reaches run, so each rank would fetch different expert
    weights and wait on gathers the other never joins; the sparse block is a ZeRO-3 leaf module, gathered whole, and
    training goes on. The merged export carries the modeling code and loads with trust_remote_code, as the base does."""
    from transformers import AutoModelForCausalLM

    from tests.distributed.harness import stage, train
    from tests.published import per_expert_moe_scaled

    model = per_expert_moe_scaled(tmp_path / "PerExpert-MoE-scaled")
    remote = ["model.trust_remote_code=true"]
    staged = stage(tmp_path / "storage", str(model), [*remote, f"data.source={sft_data}", "data.max_length=96"])
    overrides = [*remote, "train.max_steps=3", "train.save_steps=3", "deepspeed.config=config/deepspeed/zero3.json"]
    disjoint = {"TANDEM_TEST_DISJOINT_ROUTING": "1"}
    run = train(staged, "per-expert-disjoint", [*overrides, "train.export_merged=true"], env=disjoint)
    steps = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "loss" in s and "event" not in s]
    assert len(steps) == 3 and all(math.isfinite(s["loss"]) and s["aux_loss"] > 0 for s in steps)
    logs = "".join(path.read_text(errors="replace") for path in (run.run_dir / "nodes").rglob("*") if path.is_file())
    assert "ZeRO-3 leaf modules (every expert gathered at once): PerExpertSparseMoeBlock" in logs
    for rank in (0, 1):
        assert f"2 routers of rank {rank} forced to its own experts" in logs
    final = run.run_dir / "final"
    adapters = json.loads((final / "adapters.json").read_text())
    assert {"gate_proj", "up_proj", "down_proj", "q_proj"} <= set(adapters["target_modules"])
    assert adapters["target_parameters"] == []
    assert (final / "merged" / "modeling_per_expert_moe.py").read_bytes() == (
        model / "modeling_per_expert_moe.py"
    ).read_bytes()
    merged = AutoModelForCausalLM.from_pretrained(final / "merged", trust_remote_code=True)
    assert type(merged).__name__ == "PerExpertMoeForCausalLM"
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in merged.state_dict()
