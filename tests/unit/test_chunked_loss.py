"""The chunked loss (trainer/chunked_loss.py) equals the full-logits one: the summed loss, every trainable gradient
(LoRA and full fine-tuning, the output layer tied or not, LoRA on the output layer) and the evaluation sums; and no
tensor as wide as the vocabulary ever holds more than one chunk of positions. In process, on the built-in tiny
model's shape in float32. The same comparisons with real ZeRO-2 and ZeRO-3 engines on 2 ranks whose chunk counts
differ are tests/unit/test_chunked_loss_zero3.py's; the ZeRO-2 and ZeRO-3 runs of tests/distributed train with it
(the reference's and the zero3 run's trajectories match the full-logits qwen-zero2 run's)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from config.schema import TrainConfig
from storage.shards import IGNORE_INDEX
from trainer import tiny
from trainer.chunked_loss import LossHead
from trainer.model import make_trainable

CHUNK = 16  # several chunks per batch, the last one short
VOCAB = tiny.RECIPE["vocab_size"]
WEIGHT_T = (tiny.RECIPE["hidden_size"], VOCAB)


def build(method: str, *, tied: bool = False, lora_targets: list[str] | None = None) -> Any:
    """The tiny model made trainable as the trainer does; LoRA's B starts non-zero so A gets a gradient too."""
    model = tiny.build_model(VOCAB, pad_id=0, eos_id=1, tie_word_embeddings=tied)
    train = TrainConfig.model_validate({"method": method, "lora": {"dropout": 0.0, "target_modules": lora_targets}})
    model = make_trainable(model, train)
    torch.manual_seed(7)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    return model


def batch(rows: int = 3, width: int = 40) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, attention mask, labels): a masked prompt on every row, one row right-padded."""
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(2, VOCAB, (rows, width), generator=generator)
    mask = torch.ones_like(ids)
    mask[-1, width - 9 :] = 0
    labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
    labels[:, :7] = IGNORE_INDEX
    return ids, mask, labels


def loss_and_grads(model: Any, chunk_tokens: int, inputs: tuple) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    ids, mask, labels = inputs
    model.zero_grad(set_to_none=True)
    head = LossHead.of(model, chunk_tokens)
    loss = head.summed(model(input_ids=ids, attention_mask=mask, **head.forward_kwargs(ids.device)), labels)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize(("method", "tied", "targets"), [
    ("lora", False, None),                # Tandem's default targets: every attention and MLP projection
    ("lora", False, ["q_proj", "lm_head"]),  # a LoRA-wrapped output layer is called as a module, LoRA included
    ("full", False, None),
    ("full", True, None),                 # the output layer is the input embedding: both uses add to one gradient
])
def test_chunked_loss_and_gradients_equal_the_full_logits_ones(method: str, tied: bool, targets: list[str] | None):
    model = build(method, tied=tied, lora_targets=targets)
    inputs = batch()
    assert int((inputs[2][:, 1:] != IGNORE_INDEX).sum()) % CHUNK  # the last chunk is a short one
    full_loss, full_grads = loss_and_grads(model, 0, inputs)
    chunked_loss, chunked_grads = loss_and_grads(model, CHUNK, inputs)
    torch.testing.assert_close(chunked_loss, full_loss, rtol=1e-5, atol=0)
    assert chunked_grads.keys() == full_grads.keys() and full_grads
    for name, grad in full_grads.items():
        assert grad.abs().max() > 0, name  # every compared gradient carries signal
        # rtol 1e-5, with the absolute slack scaled to the tensor: elements near zero differ by rounding alone.
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-5, atol=1e-5 * float(grad.abs().max()),
                                   msg=name)


def test_chunked_evaluation_sums_equal_the_full_logits_ones() -> None:
    model = build("lora").eval()
    ids, mask, labels = batch()
    with torch.no_grad():
        sums = {}
        for chunk in (0, CHUNK):
            head = LossHead.of(model, chunk)
            sums[chunk] = head.eval_sums(model(input_ids=ids, attention_mask=mask, **head.forward_kwargs(ids.device)),
                                         labels)
    (full_loss, full_targets, full_correct), (loss, targets, correct) = sums[0], sums[CHUNK]
    assert (targets, correct) == (full_targets, full_correct) and targets == int((labels[:, 1:] != IGNORE_INDEX).sum())
    assert loss == pytest.approx(full_loss, rel=1e-6)


def test_a_batch_without_targets_gives_zero_loss_and_zero_gradients() -> None:
    model = build("full")
    ids, mask, labels = batch()
    loss, grads = loss_and_grads(model, CHUNK, (ids, mask, torch.full_like(labels, IGNORE_INDEX)))
    assert float(loss) == 0.0
    # The output layer is reached (DeepSpeed needs every trained weight in the backward pass), with zero gradient.
    assert all(float(g.abs().max()) == 0.0 for g in grads.values()) and "lm_head.weight" in grads


class WidestLogits(TorchDispatchMode):
    """The most elements of any tensor an operator produced whose last dimension is the vocabulary, the output
    layer's own weight (hidden x vocabulary, as the matrix product sees it) aside."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and vocab_wide(leaf):
                self.largest = max(self.largest, leaf.numel())
        return out


def vocab_wide(tensor: torch.Tensor) -> bool:
    return tensor.dim() > 0 and tensor.shape[-1] == VOCAB and tensor.shape != WEIGHT_T


@pytest.mark.parametrize("method", ["lora", "full"])
def test_no_tensor_as_wide_as_the_vocabulary_holds_more_than_one_chunk(method: str) -> None:
    """Forward and backward: the full-logits loss makes batch x positions x vocabulary tensors; the chunked one
    never more than a chunk's (whatever the sequence length), and keeps none of them for the backward pass (it
    recomputes each chunk there), so at most one chunk's logits and their gradient exist at a time."""
    model = build(method)
    inputs = batch(rows=2, width=256)
    widest, kept = {}, {}
    for chunk in (0, 64):
        kept[chunk] = 0

        def pack(tensor: torch.Tensor, chunk: int = chunk) -> torch.Tensor:
            kept[chunk] += tensor.numel() if vocab_wide(tensor) else 0
            return tensor

        with WidestLogits() as mode, torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss_and_grads(model, chunk, inputs)
        widest[chunk] = mode.largest
    assert widest[0] >= 2 * 255 * VOCAB and kept[0] >= 2 * 255 * VOCAB
    assert widest[64] == 64 * VOCAB and kept[64] == 0
