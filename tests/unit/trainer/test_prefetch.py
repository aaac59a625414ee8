"""trainer/prefetch.py: each step's micro-batches are the dealer's for that step, the next step's dealt by the worker
thread while the caller works, any other step (the first, a resume) dealt on the spot; none past the last step; an
error of the worker raised where its step is asked for; batches pinned, nested dataclasses included. Pinning needs a
GPU (page-locked memory is CUDA's): the pinning test replaces `Tensor.pin_memory` with a marker, said there. Every
training run of the suite deals its steps through it (trainer/loop.py)."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from trainer.data import Batch
from trainer.prefetch import StepPrefetcher, pinned


class Dealer:
    """Step s's batches are [s, s]; records which thread dealt which step."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.calls: list[tuple[int, str]] = []
        self.fail_at = fail_at

    def __call__(self, step: int) -> list[int]:
        self.calls.append((step, threading.current_thread().name))
        if step == self.fail_at:
            raise ValueError(f"shard of step {step} is corrupt")
        return [step, step]


def test_each_step_is_the_dealers_and_the_next_is_dealt_ahead_by_the_worker() -> None:
    dealer = Dealer()
    prefetch = StepPrefetcher(dealer, last_step=5, pin=False)
    assert [prefetch.batches(step) for step in range(5)] == [[s, s] for s in range(5)]
    prefetch.close()
    assert [step for step, _ in dealer.calls] == [0, 1, 2, 3, 4]  # each once, none past the last step
    assert dealer.calls[0][1] == threading.main_thread().name  # the first: nothing was ahead
    assert all(name.startswith("prefetch") for _, name in dealer.calls[1:])


def test_another_step_than_the_one_ahead_is_dealt_on_the_spot() -> None:
    dealer = Dealer()
    prefetch = StepPrefetcher(dealer, last_step=10, pin=False)
    assert prefetch.batches(2) == [2, 2]
    assert prefetch.batches(7) == [7, 7]  # step 3 was ahead: finished, dropped, 7 dealt here
    assert prefetch.batches(8) == [8, 8]
    prefetch.close()  # step 9, ahead and never asked for, may be cancelled before it starts
    assert sorted(step for step, _ in dealer.calls) in ([2, 3, 7, 8], [2, 3, 7, 8, 9])
    assert (7, threading.main_thread().name) in dealer.calls


def test_an_error_of_the_worker_is_raised_where_its_step_is_asked_for() -> None:
    prefetch = StepPrefetcher(Dealer(fail_at=2), last_step=5, pin=False)
    assert prefetch.batches(1) == [1, 1]
    with pytest.raises(ValueError, match="shard of step 2 is corrupt"):
        prefetch.batches(2)
    prefetch.close()


def test_pinning_reaches_every_tensor_of_nested_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here: `Tensor.pin_memory` (which needs CUDA) is replaced by a copy marked as pinned."""

    @dataclasses.dataclass(frozen=True)
    class Outer:
        sequences: Batch
        desirable: torch.Tensor
        pairs: bool

    marked: set[int] = set()

    def pin(tensor: torch.Tensor) -> torch.Tensor:
        copy = tensor.clone()
        marked.add(id(copy))
        return copy

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    ids = torch.arange(6).reshape(2, 3)
    batch = Outer(Batch(ids, torch.ones_like(ids), ids.clone(), None), torch.tensor([True, False]), True)
    out = pinned(batch)
    tensors = [out.sequences.input_ids, out.sequences.attention_mask, out.sequences.labels, out.desirable]
    assert all(id(t) in marked for t in tensors) and out.sequences.position_ids is None and out.pairs is True
    assert torch.equal(out.sequences.input_ids, ids) and torch.equal(out.desirable, batch.desirable)
