"""Variable-length attention on a real GPU (train.attention, trainer/model/attention.py): a micro-batch flattened into
one
padding-free row (trainer/data.py `collate_flat`) through PyTorch's variable-length flash attention, and through
flash-attn's where it is installed, gives each example the loss it has alone, and the padded micro-batch's loss and
gradients through sdpa. bfloat16, as training runs on a GPU: losses within 1% (attention's bf16 reductions run over
different shapes). Skipped without CUDA (CI); the CPU tests run the same code with a stand-in for the kernel
(tests/unit/trainer/model/test_attention.py)."""

from __future__ import annotations

import pytest
import torch

from storage.shards import Row
from tests.unit.trainer.model.test_attention import example_losses, model_with, rows, split_examples
from trainer.data import collate, collate_flat
from trainer.loss.chunked import LossHead
from trainer.model import attention
from trainer.model.attention import Attention

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
TOLERANCE = 1e-2


def implementations() -> list[str]:
    found = [attention.register().value]
    if attention.flash_missing(CUDA) is None:
        found.append(Attention.FLASH.value)
    return found


def on_gpu(implementation: str, family: str = "qwen2") -> torch.nn.Module:
    return model_with(implementation, family).to(CUDA, torch.bfloat16)


def test_auto_takes_variable_length_attention_on_a_gpu() -> None:
    assert attention.resolve("auto", CUDA).varlen


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_each_example_of_a_flattened_micro_batch_has_its_loss_alone(family: str) -> None:
    examples = [Row(ids, labels, [n]) for ids, labels, n in split_examples(rows())]
    alone = [example_losses(on_gpu("sdpa", family), collate([example], 0), CUDA)[0] for example in examples]
    for implementation in implementations():
        got = example_losses(on_gpu(implementation, family), collate_flat(rows(), 0), CUDA)
        assert got == pytest.approx(alone, rel=TOLERANCE), implementation


def test_the_training_loss_and_gradients_of_a_flattened_micro_batch_are_the_padded_ones() -> None:
    def loss_and_grads(implementation: str, flat: bool) -> tuple[float, list[torch.Tensor]]:
        model = on_gpu(implementation).train()
        head = LossHead.of(model, 8)
        batch = (collate_flat if flat else collate)(rows(), 0)
        loss = head.summed(model(**batch.model_inputs(CUDA), **head.forward_kwargs(CUDA)), batch.labels)
        loss.backward()
        return float(loss.detach()), [p.grad.float() for p in model.parameters() if p.grad is not None]

    want_loss, want = loss_and_grads("sdpa", flat=False)
    for implementation in implementations():
        got_loss, got = loss_and_grads(implementation, flat=True)
        assert got_loss == pytest.approx(want_loss, rel=TOLERANCE), implementation
        for a, b in zip(got, want, strict=True):
            assert torch.allclose(a, b, atol=5e-2 * float(b.abs().max())), implementation
