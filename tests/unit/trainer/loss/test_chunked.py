"""The loss from the last hidden states (trainer/loss/chunked.py), chunked or in one pass, equals the full-logits one:
the summed loss, every trainable gradient (LoRA and full fine-tuning, the output layer tied or not, LoRA on the output
layer) and the evaluation sums; chunked, no tensor as wide as the vocabulary ever holds more than one chunk of
positions; and which of the two a micro-batch takes follows the size of its target logits. In process, on the
built-in tiny model's shape in float32. Its 2,048-token vocabulary takes one pass at the default threshold, so the
chunked path is forced here (`one_pass_max_bytes=0`). The same comparisons with real ZeRO-2 and ZeRO-3 engines on
2 ranks whose chunk counts differ are the last test's (its ranks: chunked_zero3_ranks.py); the ZeRO-2 and ZeRO-3 runs of
tests/distributed train with it, in one pass (the reference's and the zero3 run's trajectories match the full-logits
qwen-zero2 run's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from config.sections.model_train import TrainConfig
from storage.shards import IGNORE_INDEX
from tests.unit.trainer.loss import chunked_zero3_ranks
from trainer.loss.chunked import LOGIT_BYTES, LossHead
from trainer.model import tiny
from trainer.model.adapters import make_trainable

CHUNK = 16  # several chunks per batch, the last one short
CHUNKED, ONE_PASS = 0, None  # one_pass_max_bytes: 0 chunks every micro-batch; None: the default threshold
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


def head_of(model: Any, chunk_tokens: int, one_pass_max_bytes: int | None = CHUNKED) -> LossHead:
    """LossHead.of, chunked (0), at the default threshold (None) or at a given one."""
    return LossHead.of(
        model, chunk_tokens, **({} if one_pass_max_bytes is None else {"one_pass_max_bytes": one_pass_max_bytes})
    )


def loss_and_grads(
    model: Any, chunk_tokens: int, inputs: tuple, one_pass_max_bytes: int | None = CHUNKED
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    ids, mask, labels = inputs
    model.zero_grad(set_to_none=True)
    head = head_of(model, chunk_tokens, one_pass_max_bytes)
    loss = head.summed(model(input_ids=ids, attention_mask=mask, **head.forward_kwargs(ids.device)), labels)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("one_pass_max_bytes", [CHUNKED, ONE_PASS], ids=["chunked", "one-pass"])
@pytest.mark.parametrize(
    ("method", "tied", "targets"),
    [
        ("lora", False, None),  # Tandem's default targets: every attention and MLP projection
        ("lora", False, ["q_proj", "lm_head"]),  # a LoRA-wrapped output layer is called as a module, LoRA included
        ("full", False, None),
        ("full", True, None),  # the output layer is the input embedding: both uses add to one gradient
    ],
)
def test_chunked_loss_and_gradients_equal_the_full_logits_ones(
    method: str, tied: bool, targets: list[str] | None, one_pass_max_bytes: int | None
):
    model = build(method, tied=tied, lora_targets=targets)
    inputs = batch()
    assert int((inputs[2][:, 1:] != IGNORE_INDEX).sum()) % CHUNK  # the last chunk is a short one
    full_loss, full_grads = loss_and_grads(model, 0, inputs)
    chunked_loss, chunked_grads = loss_and_grads(model, CHUNK, inputs, one_pass_max_bytes)
    torch.testing.assert_close(chunked_loss, full_loss, rtol=1e-5, atol=0)
    assert chunked_grads.keys() == full_grads.keys() and full_grads
    for name, grad in full_grads.items():
        assert grad.abs().max() > 0, name  # every compared gradient carries signal
        # rtol 1e-5, with the absolute slack scaled to the tensor: elements near zero differ by rounding alone.
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-5, atol=1e-5 * float(grad.abs().max()), msg=name)


def weighted_logps(head: LossHead, out: Any, labels: torch.Tensor) -> torch.Tensor:
    """Each row's log-probability of its targets (the preference objectives' path), weighted 1, 2, 3, ... by row and
    summed, so that a target's log-probability counted in another row changes the value and the gradients."""
    logps, counts = head.sequence_logps(out, labels)
    assert counts.tolist() == (labels[:, 1:] != IGNORE_INDEX).sum(dim=1).tolist()
    return (logps * torch.arange(1, len(logps) + 1, device=logps.device)).sum()


@pytest.mark.parametrize("one_pass_max_bytes", [CHUNKED, ONE_PASS], ids=["chunked", "one-pass"])
@pytest.mark.parametrize("method", ["lora", "full"])
def test_each_rows_log_probability_and_its_gradients_equal_the_full_logits_ones(
    method: str, one_pass_max_bytes: int | None
) -> None:
    """What DPO, IPO, KTO and ORPO compare (trainer/loss/logps.py from full logits), through the head in chunks."""
    model = build(method)
    ids, mask, labels = batch()
    results = []
    for chunk, threshold in ((0, CHUNKED), (CHUNK, one_pass_max_bytes)):
        model.zero_grad(set_to_none=True)
        head = head_of(model, chunk, threshold)
        out = model(input_ids=ids, attention_mask=mask, **head.forward_kwargs(ids.device))
        logps, _ = head.sequence_logps(out, labels)
        weighted_logps(head, out, labels).backward()
        results.append((logps.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}))
    (full, full_grads), (chunked, chunked_grads) = results
    assert bool((full < 0).all()) and len(full) == 3
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=0)
    for name, grad in full_grads.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-5, atol=1e-5 * float(grad.abs().max()), msg=name)


@pytest.mark.parametrize("one_pass_max_bytes", [CHUNKED, ONE_PASS], ids=["chunked", "one-pass"])
def test_chunked_evaluation_sums_equal_the_full_logits_ones(one_pass_max_bytes: int | None) -> None:
    model = build("lora").eval()
    ids, mask, labels = batch()
    with torch.no_grad():
        sums = {}
        for chunk in (0, CHUNK):
            head = head_of(model, chunk, one_pass_max_bytes)
            sums[chunk] = head.eval_sums(
                model(input_ids=ids, attention_mask=mask, **head.forward_kwargs(ids.device)), labels
            )
    (full_loss, full_targets, full_correct), (loss, targets, correct) = sums[0], sums[CHUNK]
    assert (targets, correct) == (full_targets, full_correct) and targets == int((labels[:, 1:] != IGNORE_INDEX).sum())
    assert loss == pytest.approx(full_loss, rel=1e-6)


@pytest.mark.parametrize("one_pass_max_bytes", [CHUNKED, ONE_PASS], ids=["chunked", "one-pass"])
def test_a_batch_without_targets_gives_zero_loss_and_zero_gradients(one_pass_max_bytes: int | None) -> None:
    model = build("full")
    ids, mask, labels = batch()
    loss, grads = loss_and_grads(model, CHUNK, (ids, mask, torch.full_like(labels, IGNORE_INDEX)), one_pass_max_bytes)
    assert float(loss) == 0.0
    # The output layer is reached (DeepSpeed needs every trained weight in the backward pass), with zero gradient.
    assert all(float(g.abs().max()) == 0.0 for g in grads.values()) and "lm_head.weight" in grads


class WidestLogits(TorchDispatchMode):
    """The most elements of any tensor an operator produced whose last dimension is the vocabulary, the output
    layer's own weight (hidden x vocabulary, as the matrix product sees it) aside."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and vocab_wide(leaf):
                self.largest = max(self.largest, leaf.numel())
        return out


def vocab_wide(tensor: torch.Tensor) -> bool:
    return tensor.dim() > 0 and tensor.shape[-1] == VOCAB and tensor.shape != WEIGHT_T


def widest_and_kept(model: Any, chunk_tokens: int, inputs: tuple, one_pass_max_bytes: int | None) -> tuple[int, int]:
    """(elements of the widest vocabulary-wide tensor made, elements of those saved for the backward pass) over a
    forward and backward pass."""
    kept = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal kept
        kept += tensor.numel() if vocab_wide(tensor) else 0
        return tensor

    with WidestLogits() as mode, torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss_and_grads(model, chunk_tokens, inputs, one_pass_max_bytes)
    return mode.largest, kept


@pytest.mark.parametrize("method", ["lora", "full"])
def test_no_tensor_as_wide_as_the_vocabulary_holds_more_than_one_chunk(method: str) -> None:
    """Forward and backward: the full-logits loss makes batch x positions x vocabulary tensors; the chunked one
    never more than a chunk's (whatever the sequence length), and keeps none of them for the backward pass (it
    recomputes each chunk there), so at most one chunk's logits and their gradient exist at a time."""
    model = build(method)
    inputs = batch(rows=2, width=256)
    widest, kept = widest_and_kept(model, 0, inputs, CHUNKED)
    assert widest >= 2 * 255 * VOCAB and kept >= 2 * 255 * VOCAB
    assert widest_and_kept(model, 64, inputs, CHUNKED) == (64 * VOCAB, 0)


def test_chunks_are_chosen_by_the_size_of_a_micro_batchs_target_logits() -> None:
    """A micro-batch whose float32 target logits fit in one_pass_max_bytes takes them in one pass over its target
    positions only, kept for the backward pass (no recomputation); a larger one is chunked, nothing kept. At the
    default threshold the tiny vocabulary's micro-batches all take one pass."""
    model = build("lora")
    small, large = batch(rows=1, width=64), batch(rows=2, width=256)
    targets = {
        name: int((inputs[2][:, 1:] != IGNORE_INDEX).sum()) for name, inputs in (("small", small), ("large", large))
    }
    threshold = targets["small"] * VOCAB * LOGIT_BYTES  # the small batch's logits exactly
    widest, kept = widest_and_kept(model, 64, small, threshold)
    assert widest == targets["small"] * VOCAB and kept >= targets["small"] * VOCAB
    assert targets["large"] > 64 and widest_and_kept(model, 64, large, threshold) == (64 * VOCAB, 0)
    widest, kept = widest_and_kept(model, 64, large, ONE_PASS)
    assert widest == targets["large"] * VOCAB and kept >= targets["large"] * VOCAB


def test_chunked_loss_and_gradients_equal_the_full_logits_ones_under_zero2_and_zero3(tmp_path: Path) -> None:
    """On 2 gloo ranks with real DeepSpeed engines (chunked_zero3_ranks.py: what is compared, and why)."""
    results = chunked_zero3_ranks.launch(tmp_path)
    for rank, result in enumerate(results):
        chunks = result["chunks"]
        # Each rank's own chunk count differs, so the agreement is what kept the ZeRO-3 cases from hanging.
        assert chunks[0] != chunks[1], chunks
        assert result["compared"] == [f"zero{stage}-{method}" for stage, method in chunked_zero3_ranks.CASES] + [
            "zero3-eval"
        ], rank
        assert all(count > 0 for count in result["gradients"].values()), result["gradients"]
