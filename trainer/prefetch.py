"""The next optimizer step's micro-batches, read and batched while this step runs (and on a GPU put in pinned host
memory, so that their copies to the device are asynchronous: trainer/data.py `Batch.model_inputs` queues them
non-blocking).

A step's micro-batches are a pure function of the step (the objective's dealer over the memory-mapped rows and the
epoch permutation), so the worker thread deals step s + 1 while the main thread trains step s, and the loop takes it
when it asks for s + 1; asked for any other step (the first, a resume) it deals that one itself. One worker, one step
ahead: at most one extra step of batches held on the host. An error in the worker is raised where the step asks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

Deal = Callable[[int], list[Any]]


def pinned(value: Any) -> Any:
    """`value` with every tensor it holds (a batch dataclass, nested) in page-locked host memory."""
    if isinstance(value, torch.Tensor):
        return value.pin_memory()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: pinned(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **fields)
    return value


class StepPrefetcher:
    """Each step's micro-batches, the next one dealt in the background (see the module docstring)."""

    def __init__(self, deal: Deal, last_step: int, *, pin: bool) -> None:
        self._deal = (lambda step: [pinned(batch) for batch in deal(step)]) if pin else deal
        self._last = last_step
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
        self._ahead: tuple[int, Future[list[Any]]] | None = None

    def batches(self, step: int) -> list[Any]:
        """Step `step`'s micro-batches (0-based); the next step's start dealing before this returns."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == step:
            batches = ahead[1].result()
        else:
            if ahead is not None:
                ahead[1].result()  # one reader of the rows at a time: let a stale one finish
            batches = self._deal(step)
        if step + 1 < self._last:
            self._ahead = (step + 1, self._pool.submit(self._deal, step + 1))
        return batches

    def close(self) -> None:
        """Stop the worker (a step dealt ahead and never asked for is dropped)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
