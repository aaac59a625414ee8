"""Liger's kernels on a real GPU (train.kernels=liger, trainer/model/kernels.py): a tiny Qwen2-shaped model patched with
Liger's RMSNorm, SwiGLU and RoPE, its loss taken by Liger's fused linear cross-entropy (trainer/loss/liger.py),
gives the unpatched model's chunked loss and gradients on the same batch, in float32. Skipped without CUDA (CI)."""

from __future__ import annotations

import pytest
import torch

from tests.unit.trainer.loss.liger_interpreted import VOCAB, loss_and_grads
from trainer.loss.chunked import LossHead
from trainer.loss.liger import LigerLossHead
from trainer.model import kernels, tiny
from trainer.model.kernels import Kernels

pytestmark = pytest.mark.gpu

# Liger's RMSNorm and SwiGLU kernels reorder float32 reductions against PyTorch's; the difference grows through the
# layers, so the whole model is compared more loosely than the loss kernel alone.
MODEL_TOLERANCE = 1e-4


def test_liger_patched_model_and_fused_loss_equal_the_built_in_path() -> None:
    cuda = torch.device("cuda")
    assert kernels.resolve("auto", cuda) is Kernels.LIGER
    model = tiny.build_model(VOCAB, pad_id=0, eos_id=1).to(cuda)
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(2, VOCAB, (2, 64), generator=generator).to(cuda)
    mask = torch.ones_like(ids)
    mask[-1, 48:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :16] = -100
    chunked = LossHead.of(model, 1024)
    # Before the patch: Liger's RoPE replaces the modelling module's function for every model of the family.
    want = loss_and_grads(model, chunked, ids, mask, labels)
    applied = kernels.patch_model(model, Kernels.LIGER)
    assert applied == "Liger's RMSNorm, SwiGLU and RoPE kernels (apply_liger_kernel_to_qwen2)"
    assert "forward" in vars(model.model.norm)  # the instance's own, Liger's
    got = loss_and_grads(model, LigerLossHead.of_head(chunked), ids, mask, labels)
    for name, a, b in zip(("loss", "head grad", "norm grad"), got, want, strict=True):
        assert torch.allclose(a, b, rtol=MODEL_TOLERANCE, atol=MODEL_TOLERANCE), (name, (a - b).abs().max())
