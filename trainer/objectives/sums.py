"""An objective's metric sums as a typed value: the numerators and denominators its step and evaluation metrics are
divided from, added over micro-batches, all-reduced over ranks, divided once.

Each objective declares its own as a frozen dataclass of `Sums` whose fields are numbers or 0-d device tensors
(`Number`). A micro-batch's sums stay on the device: `plus` adds a tensor where it is, in float64 (bit for bit what
adding its value as a Python float gives), so a micro-batch never waits for the device to read them; `values` reads
them once (the step's one wait), and `reduced` is every rank's sums, in one all-reduce.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Self

import torch

from trainer.parallel.distributed import Dist, dist_sum

Number = float | torch.Tensor


def _added(total: Number, value: Number) -> Number:
    return total + (value.detach().double() if isinstance(value, torch.Tensor) else value)


@dataclass(frozen=True)
class Sums:
    """Base of an objective's sums (a frozen dataclass whose every field is a `Number`, 0 by default)."""

    def plus(self, other: Self) -> Self:
        """These sums with `other`'s added, field by field (tensors kept on their device, in float64)."""
        return type(self)(**{f.name: _added(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)})

    def values(self) -> list[float]:
        """The sums as numbers, in field order: one wait for the device, however many micro-batches added to them."""
        return [float(getattr(self, f.name)) for f in fields(self)]

    @classmethod
    def of(cls, values: Sequence[float]) -> Self:
        """The sums from their numbers in field order (what `values` gives, after an all-reduce)."""
        names = [f.name for f in fields(cls)]
        assert len(values) == len(names), f"{cls.__name__} has {len(names)} sums, got {len(values)} values"
        return cls(**dict(zip(names, values, strict=True)))

    @classmethod
    def width(cls) -> int:
        """How many numbers the sums are."""
        return len(fields(cls))

    def reduced(self, dist: Dist) -> Self:
        """Every rank's sums added (a collective: every rank calls it)."""
        return self.of(dist_sum(self.values(), dist))
