"""SFT's loss through Liger's fused linear cross-entropy (trainer/loss/liger.py) equals the chunked loss
(trainer/loss/chunked.py) on a fixed batch of a tiny Qwen2-shaped model: the summed loss, and the gradients of the
output layer's weight and of the final norm's weight through the model; the kernel's sum and mean with -100 labels (a
masked prompt, padding) in place against F.cross_entropy. Liger's kernels are Triton's: on this CPU they run under
Triton's interpreter (TRITON_INTERPRET=1), in a process of its own (liger_interpreted.py: why); importing Liger and
interpreting its kernels takes seconds, so that test is behind the `multirun` marker. Liger's RMSNorm, SwiGLU and
RoPE kernels do not run in the interpreter: the model patch is tests/gpu/test_kernels.py's. A LoRA output layer
keeps the chunked loss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from config.sections.model_train import TrainConfig
from trainer.loss.chunked import LossHead
from trainer.loss.liger import LigerLossHead
from trainer.model import tiny
from trainer.model.adapters import make_trainable

ROOT = Path(__file__).resolve().parents[4]
# Float32 throughout: Liger's blockwise log-sum-exp against one F.cross_entropy over the same logits (2e-6 was seen
# for the kernel alone); gradients through the model are summed over the batch's positions.
TOLERANCE = 1e-5


@pytest.mark.multirun
def test_fused_loss_and_gradients_equal_the_chunked_loss_under_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.unit.trainer.loss.liger_interpreted"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["head"] == "LigerLossHead"
    assert 0 < found["targets"] < found["positions"]  # some labels are -100
    assert found["loss_value"] > 0
    for name in ("loss", "head_grad", "norm_grad", "sum", "mean", "selected_sum"):
        assert found[name] <= TOLERANCE * max(1.0, found["loss_value"] if name in ("loss", "sum") else 1.0), found


def test_lora_output_layer_keeps_the_chunked_loss() -> None:
    model = tiny.build_model(64, pad_id=0, eos_id=1)
    train = TrainConfig.model_validate({"method": "lora", "lora": {"target_modules": ["q_proj", "lm_head"]}})
    chunked = LossHead.of(make_trainable(model, train), 1024)
    assert type(LigerLossHead.of_head(chunked)) is LossHead
    plain = LossHead.of(tiny.build_model(64, pad_id=0, eos_id=1), 1024)
    assert type(LigerLossHead.of_head(plain)) is LigerLossHead


@pytest.mark.multirun
def test_fused_loss_under_zero3_on_two_ranks_gathers_the_partitioned_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """liger_zero3_ranks.py on 2 gloo ranks under Triton's interpreter: with the output layer partitioned by ZeRO-3,
    the fused loss and every full gradient equal the chunked loss's on each rank."""
    import tests.unit.trainer.loss.chunked_zero3_ranks as launcher

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    real = subprocess.Popen

    def popen(args: list[str], **kwargs: Any) -> Any:  # the launcher's module swapped for the Liger ranks'
        return real(
            [arg.replace(launcher.__name__, "tests.unit.trainer.loss.liger_zero3_ranks") for arg in args], **kwargs
        )

    monkeypatch.setattr(launcher.subprocess, "Popen", popen)
    results = launcher.launch(tmp_path)
    assert [r["gradients"] for r in results] == [results[0]["gradients"]] * 2 and results[0]["gradients"] > 0
    assert results[0]["loss"] != results[1]["loss"]  # the ranks' batches differ: each compared its own
