"""A LoRA adapter on fused expert weights, exported as a run exports it: loaded with PEFT on the published base, and
merged one base shard at a time into the published per-expert layout, loaded with transformers; both give the
trained model's logits. The base is Qwen3-30B-A3B as published with its sizes scaled down (tests/published.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from config.methods import LORA
from config.sections.model_train import TrainConfig
from storage import layout
from storage.adapters import AdapterSummary
from trainer.checkpointing.expert_merge import ExpertDelta, merge_expert_weight, split_expert_pairs
from trainer.checkpointing.export import merge_adapter, save_weights
from trainer.model.adapters import make_trainable
from trainer.model.load import load_base


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture(scope="module")
def trained(qwen3_moe, tmp_path_factory) -> tuple[object, Path]:
    """A LoRA model on the experts whose adapters moved off zero (as training moves them), and its export."""
    torch.manual_seed(0)
    model = make_trainable(load_base(qwen3_moe, method=LORA, bf16=False), TrainConfig(method="lora"))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)
    model.eval()
    out = tmp_path_factory.mktemp("export")
    save_weights(None, model, str(out), zero_stage=2, shard_bytes=4_000_000, is_main=True)
    return model, out


def test_the_export_names_what_got_adapters_and_loads_with_peft_on_the_published_base(qwen3_moe, trained) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model, out = trained
    summary = AdapterSummary.from_json(json.loads((out / layout.ADAPTERS).read_text()))
    assert summary.target_modules == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert summary.target_parameters == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
    # Per layer, r 8: q and o 8 x (64 + 128) each, k and v 8 x (64 + 16) each; gate_up (8 experts, 64 x 64): A 64 x 64
    # and B 64 x 64; down_proj (8 experts, 64 x 32): A 64 x 32 and B 64 x 64.
    attention, experts = 2 * 8 * (64 + 128) + 2 * 8 * (64 + 16), 64 * 64 * 2 + 64 * 32 + 64 * 64
    assert summary.trainable == 2 * (attention + experts)
    assert 0 < summary.trainable < summary.total
    ids = torch.randint(0, 151643, (2, 12), generator=torch.Generator().manual_seed(1))
    base = AutoModelForCausalLM.from_pretrained(qwen3_moe, dtype=torch.float32)
    plain = logits(base, ids)
    loaded = PeftModel.from_pretrained(base, str(out)).eval()
    expected = logits(model, ids)
    assert not torch.allclose(plain, expected, atol=1e-3)  # the adapters change the model
    torch.testing.assert_close(logits(loaded, ids), expected, atol=1e-5, rtol=1e-5)


def test_the_merged_export_keeps_the_published_layout_and_gives_the_adapted_logits(qwen3_moe, trained) -> None:
    from transformers import AutoModelForCausalLM

    model, out = trained
    merged = out / "merged"
    merge_adapter(qwen3_moe, str(out), str(merged), None, torch.float32, shard_bytes=4_000_000)
    index = json.loads((merged / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.1.mlp.experts.7.gate_proj.weight" in index and not any("lora" in k for k in index)
    ids = torch.randint(0, 151643, (2, 12), generator=torch.Generator().manual_seed(2))
    loaded = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32)
    torch.testing.assert_close(logits(loaded, ids), logits(model, ids), atol=1e-4, rtol=1e-4)


def test_expert_deltas_follow_peft_per_expert_and_a_fused_base_weight_takes_them_all() -> None:
    experts, rank, out, into = 3, 2, 6, 4
    a, b = torch.randn(rank * experts, into), torch.randn(out, rank * experts)
    pairs = {"m.experts.base_layer": (a, b, 0.5), "m.q_proj": (torch.randn(rank, into), torch.randn(out, rank), 0.5)}
    found = split_expert_pairs(pairs, rank)
    assert list(pairs) == ["m.q_proj"] and list(found) == ["m.experts"]
    # PEFT's layout: A's rows by expert, B's columns interleaved (rank-major, expert-minor).
    expected = torch.einsum("ore,eri->eoi", b.reshape(out, rank, experts), a.reshape(experts, rank, into)) * 0.5
    assert torch.allclose(torch.stack([found["m.experts"][0].delta(e) for e in range(experts)]), expected, atol=1e-6)
    fused = torch.zeros(experts, out, into)
    owner, weight = merge_expert_weight("m.experts.down_proj", fused, found) or ("", fused)
    assert owner == "m.experts" and torch.allclose(weight, expected, atol=1e-6)
    gate = merge_expert_weight("m.experts.1.gate_proj.weight", torch.zeros(out // 2, into), found)
    up = merge_expert_weight("m.experts.1.up_proj.weight", torch.zeros(out // 2, into), found)
    assert gate and up and torch.allclose(torch.cat([gate[1], up[1]]), expected[1], atol=1e-6)
    assert merge_expert_weight("m.experts.1.down_proj.weight", torch.zeros(5, 5), found) is None
    assert ExpertDelta(a, b, 0.5, experts).shape == (out, into)
