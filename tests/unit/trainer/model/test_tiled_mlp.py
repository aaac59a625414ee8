"""train.tiled_mlp (trainer/model/tiled_mlp.py) in one process: a model whose dense MLPs run in tiles of about
hidden_size
tokens through DeepSpeed's TiledMLP gives the same loss as the untiled model and the same gradients (the weights'
under full fine-tuning, the adapters' under LoRA) within float rounding, in training and in evaluation; the tiles are
ALST's; mixture-of-experts blocks are not tiled; the config refuses it beside train.compile. Under ZeRO-3 with
sequence parallelism through real torchrun ranks: tests/distributed/test_sequence_parallel.py."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from config.loader import load_config
from core.errors import UserError
from trainer.model.tiled_mlp import tile_count, tile_mlps

# Float rounding: a tile's matrix products and the gradients added over the tiles, against one product (measured
# 5.5e-7 of the largest gradient of each parameter on this machine).
GRAD_RTOL = 1e-5


def tiny_qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return Qwen2ForCausalLM(config)


def trained_grads(model, ids: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("method", ["full", "lora", "checkpointed"])
def test_tiled_mlps_give_the_untiled_loss_and_gradients(method: str) -> None:
    """`checkpointed`: full fine-tuning with gradient checkpointing on the tiled model (its layers recomputed in
    backward, each tiled MLP recomputing its tiles inside that)."""
    reference = tiny_qwen2()
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        targets = ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]
        reference = get_peft_model(reference, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
        for name, parameter in reference.named_parameters():
            if "lora_B" in name:  # PEFT starts B at zero: give the adapters a gradient path through A as well
                torch.nn.init.normal_(parameter, std=0.02)
    tiled = copy.deepcopy(reference)
    assert tile_mlps(tiled) == 2
    if method == "checkpointed":
        tiled.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        tiled.train()
    ids = torch.randint(0, 256, (2, 300), generator=torch.Generator().manual_seed(1))  # 5 tiles of 64 tokens
    assert tile_count(300, 64) == 5
    loss, grads = trained_grads(reference, ids)
    tiled_loss, tiled_grads = trained_grads(tiled, ids)
    assert tiled_loss == pytest.approx(loss, rel=1e-6)
    assert set(tiled_grads) == set(grads) and (method != "lora" or all("lora" in name for name in grads))
    for name, grad in grads.items():
        scale = grad.abs().max().item()
        assert (tiled_grads[name] - grad).abs().max().item() <= GRAD_RTOL * scale, name
    with torch.no_grad():  # evaluation: the same forward, tiled
        assert tiled(input_ids=ids, labels=ids).loss.item() == pytest.approx(loss, rel=1e-6)
    # The state dict is unchanged: checkpoints and exports do not know the MLPs were tiled.
    assert list(tiled.state_dict()) == list(reference.state_dict())


def test_mixture_of_experts_blocks_are_not_tiled() -> None:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_experts=4,
        num_experts_per_tok=2,
    )
    assert tile_mlps(Qwen3MoeForCausalLM(config)) == 0


def test_tiles_are_alsts_and_the_config_refuses_it_beside_compile() -> None:
    assert [tile_count(n, 896) for n in (1, 896, 897, 8192, 16384)] == [1, 1, 2, 10, 19]
    assert load_config(None, ["train.tiled_mlp=true"]).train.tiled_mlp
    with pytest.raises(UserError, match=r"train\.tiled_mlp and train\.compile: .*set one of them to false"):
        load_config(None, ["train.tiled_mlp=true", "train.compile=true"])


@pytest.mark.multirun
def test_tiled_mlps_under_deepspeed_on_two_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tiled_mlp_ranks.py on 2 gloo ranks: under ZeRO-2 and ZeRO-3 (the ranks' tile counts differ, 3 and 2, and
    agree under ZeRO-3), LoRA and full, the tiled loss and every full gradient equal the untiled MLP's on each rank."""
    import tests.unit.trainer.loss.chunked_zero3_ranks as launcher

    real = subprocess.Popen

    def popen(args: list[str], **kwargs: Any) -> Any:  # the launcher's module swapped for the tiled MLP's ranks
        ranks = "tests.unit.trainer.model.tiled_mlp_ranks"
        return real([arg.replace(launcher.__name__, ranks) for arg in args], **kwargs)

    monkeypatch.setattr(launcher.subprocess, "Popen", popen)
    results = launcher.launch(tmp_path)
    assert results[0] == results[1] and set(results[0]) == {"zero2-lora", "zero2-full", "zero3-lora", "zero3-full"}
    assert all(count > 0 for count in results[0].values())
