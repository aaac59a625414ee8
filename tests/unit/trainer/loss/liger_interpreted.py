"""The process side of test_liger.py: Liger's fused linear cross-entropy under Triton's interpreter against the
chunked loss, run as a module in a process of its own with TRITON_INTERPRET=1 (Triton reads it when a kernel is
defined: a process that imported Triton's kernels without it, inductor's for instance, cannot run them interpreted).
Prints one JSON object: each compared quantity's largest absolute difference, and the counts the test checks."""

from __future__ import annotations

import json
from typing import Any

import torch

from storage.shards import IGNORE_INDEX
from trainer.loss.chunked import LossHead, target_positions
from trainer.loss.liger import LigerLossHead, fused_cross_entropy
from trainer.model import tiny

VOCAB = 96  # the interpreter runs a kernel program per row and vocabulary block in Python: a small vocabulary


def model_and_batch() -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the tiny model, input ids, attention mask, labels): a masked prompt on every row, one row right-padded."""
    model = tiny.build_model(VOCAB, pad_id=0, eos_id=1)
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(2, VOCAB, (2, 12), generator=generator)
    mask = torch.ones_like(ids)
    mask[-1, 8:] = 0
    labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
    labels[:, :4] = IGNORE_INDEX
    return model, ids, mask, labels


def loss_and_grads(model: Any, head: LossHead, ids: Any, mask: Any, labels: Any) -> tuple[torch.Tensor, ...]:
    """(summed loss, gradient of the output layer's weight, of the final norm's weight) through `head`."""
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, use_cache=False, **head.forward_kwargs(ids.device))
    loss = head.summed(out, labels)
    loss.backward()
    return loss.detach(), model.lm_head.weight.grad.clone(), model.model.norm.weight.grad.clone()


def differences() -> dict[str, Any]:
    """The trainer's two heads on one batch, and the kernel's sum and mean with -100 labels in place."""
    model, ids, mask, labels = model_and_batch()
    chunked = LossHead.of(model, 1024)
    fused = LigerLossHead.of_head(chunked)
    want = loss_and_grads(model, chunked, ids, mask, labels)
    got = loss_and_grads(model, fused, ids, mask, labels)
    names = ("loss", "head_grad", "norm_grad")
    found = {name: float((a - b).abs().max()) for name, a, b in zip(names, got, want, strict=True)}
    with torch.no_grad():
        last = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
    hidden, targets = last[:, :-1].reshape(-1, last.size(-1)), labels[:, 1:].reshape(-1)  # -100 kept: skipped
    weight = model.lm_head.weight.detach()
    count = int((targets != IGNORE_INDEX).sum())
    reference = torch.nn.functional.cross_entropy(hidden @ weight.T, targets, reduction="sum")
    selected, chosen = target_positions(last, labels)
    return found | {
        "sum": float((fused_cross_entropy(hidden, weight, targets, reduction="sum") - reference).abs()),
        "mean": float((fused_cross_entropy(hidden, weight, targets, reduction="mean") - reference / count).abs()),
        "selected_sum": float((fused_cross_entropy(selected, weight, chosen) - reference).abs()),
        "loss_value": float(want[0]),
        "targets": count,
        "positions": targets.numel(),
        "head": type(fused).__name__,
    }


if __name__ == "__main__":
    print(json.dumps(differences()))
