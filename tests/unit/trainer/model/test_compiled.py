"""train.compile's regional compilation (trainer/model/compiled.py): each decoder layer of a tiny Qwen2-shaped model is
compiled (and nothing else), a few optimizer steps of the compiled model give the eager model's losses within
TOLERANCE, the parameter names are unchanged (checkpoints and exports), and inductor's cache lands in the node cache's
`compile/`. Inductor compiles C++ for the CPU here: the compiling test is behind the `multirun` marker."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from config.sections.model_train import TrainConfig
from storage.shards import IGNORE_INDEX
from trainer.loss.chunked import LossHead
from trainer.model import compiled, tiny
from trainer.model.adapters import make_trainable

VOCAB = 128
STEPS = 3
# Inductor fuses and reorders float32 elementwise work (RMSNorm, SwiGLU, RoPE): rounding differs from eager's.
TOLERANCE = 1e-4


def trainable(method: str) -> Any:
    """The tiny model made trainable as the trainer does."""
    return make_trainable(tiny.build_model(VOCAB, pad_id=0, eos_id=1), TrainConfig.model_validate({"method": method}))


def losses(model: Any) -> list[float]:
    """Summed losses of STEPS AdamW steps on one fixed batch, through the chunked loss head."""
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(2, VOCAB, (2, 24), generator=generator)
    labels = ids.clone()
    labels[:, :6] = IGNORE_INDEX
    head = LossHead.of(model, 1024)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    seen = []
    for _ in range(STEPS):
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_cache": False}  # as Batch.model_inputs
        out = model(**batch, **head.forward_kwargs(ids.device))
        loss = head.summed(out, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        seen.append(loss.item())
    return seen


def test_the_decoder_layers_are_found_through_peft() -> None:
    model = trainable("lora")
    layers = compiled.decoder_layers(model)
    assert len(layers) == tiny.RECIPE["num_hidden_layers"]
    assert {type(layer).__name__ for layer in layers} == {"Qwen2DecoderLayer"}


def test_the_caches_go_to_the_node_cache_unless_the_user_chose_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # so that monkeypatch restores it after the test
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    cache_dir()  # inductor writes its own default into the variable: not the user's choice
    compiled.use_node_cache(tmp_path)
    assert cache_dir() == str(tmp_path / "compile" / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "mine")


@pytest.mark.multirun
def test_compiled_layers_train_like_eager_ones_and_cache_in_the_node_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in compiled.CACHE_DIRS:  # unset for the test, restored after it (compile_layers sets them)
        monkeypatch.setenv(variable, "")
        monkeypatch.delenv(variable)
    torch._dynamo.reset()
    eager = losses(trainable("full"))
    model = trainable("full")
    names = [name for name, _ in model.named_parameters()]
    assert compiled.compile_layers(model, tmp_path) == tiny.RECIPE["num_hidden_layers"]
    assert [name for name, _ in model.named_parameters()] == names
    got = losses(model)
    assert got == pytest.approx(eager, rel=TOLERANCE), (got, eager)
    assert got[-1] < got[0]
    assert any((tmp_path / "compile" / "inductor").rglob("*.py"))  # the layers' generated code, in the node cache
