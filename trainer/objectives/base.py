"""The objective contract: what the step loop (trainer/loop.py, trainer/step.py) and the evaluation
(trainer/evaluation/stage.py) ask of an objective, and the one check that the staged rows are what it trains on.

An objective is one object per run, built by trainer/objectives/registry.py from the config's objective
(config/objectives.py: its name, the data it trains on, its metrics, its reference model, its model card text) and its
settings; `objective` is that config object. It owns everything that differs from one objective to another:

- `start`: what it needs before the first step and before any checkpoint is resumed (the loss head; full
  fine-tuning's reference table for DPO and IPO), and `start_evaluation`: the same for the evaluate stage;
- `deal`: this rank's micro-batches of an optimizer step (supervised rows, or preference units);
- `begin_step`: the global batch's counts its loss is divided by, all-reduced (and KTO's reference point);
- `micro_batch`: a micro-batch's loss ready for backward, and its metric sums (`sum_keys`): the loss is scaled so that
  the backward passes of every micro-batch on every rank, DeepSpeed's averaging over accumulation and ranks undone,
  add up to the gradient of the global batch's loss, whatever the micro-batch, accumulation and world size;
- `end_step`: the step's loss, target tokens and its own metrics for metrics.jsonl, from the all-reduced sums;
- `evaluate`: its metrics over rows of the eval split (sums all-reduced and divided once), `eval_fields`: what
  eval.json records beside them, `summary`: the log line.

What every objective shares -- the step's timing, heartbeats, fault hooks, backward, optimizer and one all-reduce of
the sums -- is step.py's. Where later work plugs in: a fused loss is a loss head (trainer/loss/) that an objective's
`micro_batch` takes; sequence parallelism sums an objective's counts in `begin_step` and its sums over the sequence
group; an auxiliary loss (a mixture of experts' load balancing) is added to what `micro_batch` returns.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from config.objectives import FEEDBACK_DATA, PAIR_DATA, SUPERVISED_DATA, DataKind, Objective, either, trained_on
from core.errors import UserError
from storage.shards import PAIR
from storage.spec import Spec
from storage.split_reader import Split
from trainer.data import GlobalOrder
from trainer.parallel.distributed import Dist, dist_sum

# An objective's metric sums (numerators and denominators), added over micro-batches and all-reduced, divided once.
Sums = dict[str, float]
# Sums being added up over a step's micro-batches: device tensors until `settled` reads them.
Pending = dict[str, float | torch.Tensor]


@dataclass(frozen=True)
class MicroLoss:
    """A micro-batch's loss, scaled for backward (see the module's docstring), and its metric sums: numbers, or
    0-d tensors read only after the backward pass (reading a tensor on a GPU waits for it: before backward, the
    device would idle while the backward pass is queued)."""

    backward: torch.Tensor
    sums: Mapping[str, float | torch.Tensor]


@dataclass(frozen=True)
class StepResult:
    """An optimizer step as the objective reports it: the global batch's loss, its target tokens, and the objective's
    own step metrics (metrics.jsonl: a preference objective's reward accuracy and margin, KTO's kl)."""

    loss: float
    target_tokens: int
    metrics: dict[str, float]


class MicroBatch(Protocol):
    """What the step asks of any objective's micro-batch."""

    @property
    def padding(self) -> tuple[int, int]:
        """(pad positions, all positions)."""
        ...


class TrainObjective(Protocol):
    """An objective on a rank (see the module's docstring)."""

    objective: Objective
    sum_keys: tuple[str, ...]

    def start(self, engine: Any, spec: Spec, dist: Dist, pad_id: int) -> None:
        """Before the first step and before any checkpoint is resumed."""
        ...

    def start_evaluation(self, spec: Spec, rows: Split) -> None:
        """Before the evaluate stage evaluates the eval split `rows`."""
        ...

    def deal(
        self,
        rows: Split,
        order: GlobalOrder,
        *,
        step: int,
        micro: int,
        accum: int,
        rank: int,
        world: int,
        pad_id: int,
        group_by_length: bool,
    ) -> Iterator[MicroBatch]:
        """This rank's `accum` micro-batches of optimizer step `step` (0-based)."""
        ...

    def begin_step(self, model: Any, batches: Sequence[Any], dist: Dist) -> Any:
        """The step's scope: the global batch's counts (all-reduced) that micro_batch and end_step divide by."""
        ...

    def micro_batch(self, model: Any, batch: Any, scope: Any) -> MicroLoss:
        """A micro-batch's loss, scaled for backward, and its metric sums."""
        ...

    def end_step(self, sums: Sums, scope: Any) -> StepResult:
        """The step's result from the sums of every micro-batch of every rank."""
        ...

    def evaluate(
        self,
        model: Any,
        rows: Split,
        indices: Sequence[int],
        dist: Dist,
        *,
        batch_size: int,
        pad_id: int,
        lockstep: bool,
    ) -> dict[str, Any]:
        """Its evaluation metrics over the rows `indices` of the eval split `rows`, equal on any world size."""
        ...

    def eval_fields(self) -> dict[str, Any]:
        """What eval.json records of it beside its metrics."""
        ...

    def summary(self, result: dict[str, Any]) -> str:
        """The evaluation's log line."""
        ...


def add(into: Pending, sums: Mapping[str, float | torch.Tensor], keys: Sequence[str]) -> None:
    """Accumulate metric sums. A tensor stays where it is, added in float64 (bit for bit what adding its value as a
    Python float gives), so that a micro-batch does not wait for the device to read it; `settled` reads them once."""
    for key in keys:
        value = sums.get(key, 0.0)
        into[key] = into.get(key, 0.0) + (value.detach().double() if isinstance(value, torch.Tensor) else value)


def settled(sums: Pending) -> Sums:
    """The sums as numbers: one wait for the device (the first read), however many micro-batches added to them."""
    return {key: float(value) for key, value in sums.items()}


def reduced(sums: Pending, keys: Sequence[str], dist: Dist) -> Sums:
    """The sums of every rank."""
    mine = settled(sums)
    return dict(zip(keys, dist_sum([mine.get(key, 0.0) for key in keys], dist), strict=True))


def held_data(rows: Split) -> DataKind:
    """What a non-empty split holds: supervised rows, pairs or KTO feedback (one kind a dataset: staging/stage.py)."""
    if not rows.preference:
        return SUPERVISED_DATA
    return PAIR_DATA if rows.feedback(0) == PAIR else FEEDBACK_DATA


def check_rows(rows: Split, objective: Objective) -> None:
    """The objective trains on what the split holds (a dataset staged for another objective stops the run here)."""
    if not len(rows) or (held := held_data(rows)) == objective.data:
        return
    if held.preference_rows != objective.data.preference_rows:
        raise UserError(
            f"train.objective={objective.name} and the staged dataset disagree: it holds "
            f"{'preference' if held.preference_rows else 'supervised'} rows; stage it with data.preference="
            f"{either(list(objective.data.preference))}"
        )
    raise UserError(
        f"train.objective={objective.name}: the dataset holds {held.words}; set train.objective to "
        f"{either(trained_on(held))}"
    )
