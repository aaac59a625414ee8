"""The objective contract: what the step loop (trainer/loop.py, trainer/step.py) and the evaluation
(trainer/evaluation/stage.py) ask of an objective, and the one check that the staged rows are what it trains on.

An objective is one object per run, built by trainer/objectives/registry.py from the config's objective
(config/objectives.py: its name, the data it trains on, its metrics, its reference model, its model card text) and its
settings; `objective` is that config object. It owns everything that differs from one objective to another:

- `start`: what it needs before the first step and before any checkpoint is resumed, from the built engine
  (trainer/build.py `Built`: the engine, the pad id and the run's resolved choices, which it reads and never makes
  again: the loss head, the micro-batches' layout; full fine-tuning's reference table for DPO and IPO), and
  `start_evaluation`: the same for the evaluate stage;
- `deal`: this rank's micro-batches of an optimizer step (supervised rows, or preference units), as `Dealing` says;
- `begin_step`: the step's scope, the global batch's counts its loss is divided by, all-reduced (and KTO's
  reference point);
- `micro_batch`: a micro-batch's loss ready for backward, and its sums (its own `Sums` type, trainer/objectives/
  sums.py): the loss is scaled so that the backward passes of every micro-batch on every rank, DeepSpeed's averaging
  over accumulation and ranks undone, add up to the gradient of the global batch's loss, whatever the micro-batch,
  accumulation and world size; it runs the model through the `Policy` (trainer/objectives/policy.py);
- `end_step`: the step's loss, target tokens and its own metrics for metrics.jsonl, from the all-reduced sums;
- `evaluate`: its metrics over rows of the eval split (sums all-reduced and divided once), `eval_fields`: what
  eval.json records beside them, `summary`: the log line;
- `state_dict` / `load_state_dict`: what a checkpoint keeps of it beside the engine (GRPO's rollouts of a window that
  spans several steps; None for the others), restored on resume on any world size.

The contract is generic over the objective's micro-batch, scope and sums types, so each objective's own types are
checked from `deal` to `end_step`. What every objective shares -- the step's timing, heartbeats, fault hooks,
backward, optimizer, a mixture of experts' load-balancing loss, and one all-reduce of the sums -- is trainer/step.py's.
Where later work plugs in: a fused loss is a loss head (trainer/loss/) that an objective's `micro_batch` takes;
sequence parallelism sums an objective's counts in `begin_step` and its sums over the sequence group.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import torch

from config.objectives import (
    FEEDBACK_DATA,
    PAIR_DATA,
    PROMPT_DATA,
    SUPERVISED_DATA,
    DataKind,
    Objective,
    either,
    trained_on,
)
from core.errors import UserError
from storage.shards import PAIR
from storage.spec import Spec
from storage.split_reader import Split
from trainer.data import Dealing, GlobalOrder, Images
from trainer.objectives.policy import Policy
from trainer.objectives.sums import Sums
from trainer.parallel.distributed import Dist

if TYPE_CHECKING:
    from trainer.build import Built


class MicroBatch(Protocol):
    """What the step asks of any objective's micro-batch."""

    @property
    def padding(self) -> tuple[int, int]:
        """(pad positions, all positions)."""
        ...


BatchT = TypeVar("BatchT", bound=MicroBatch)
ScopeT = TypeVar("ScopeT")
SumsT = TypeVar("SumsT", bound=Sums)


@dataclass(frozen=True)
class MicroLoss(Generic[SumsT]):
    """A micro-batch's loss, scaled for backward (see the module's docstring), and its sums: numbers, or 0-d tensors
    read only after the backward pass (reading a tensor on a GPU waits for it: before backward, the device would idle
    while the backward pass is queued)."""

    backward: torch.Tensor
    sums: SumsT


@dataclass(frozen=True)
class StepResult:
    """An optimizer step as the objective reports it: the global batch's loss, its target tokens, and the objective's
    own step metrics (metrics.jsonl: a preference objective's reward accuracy and margin, KTO's kl)."""

    loss: float
    target_tokens: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class EvalOptions:
    """How an evaluation runs its passes: rows per pass, the pad id, `lockstep` (a ZeRO-3 engine, whose forward is
    collective: every rank runs as many passes), and a vision-language model's images (None: text only)."""

    batch_size: int
    pad_id: int
    lockstep: bool = False
    images: Images | None = None


# An objective's evaluation figures (eval.json's top level, the gate's metrics): numbers, its name, its reference, and
# GRPO's generated answers' figures (a `generate` section, as eval.generate's).
Metrics = dict[str, float | int | str | dict[str, Any] | None]


class TrainObjective(Protocol[BatchT, ScopeT, SumsT]):
    """An objective on a rank (see the module's docstring)."""

    objective: Objective
    sums_type: type[SumsT]

    def start(self, built: Built, spec: Spec, dist: Dist) -> None:
        """Before the first step and before any checkpoint is resumed."""
        ...

    def start_evaluation(self, spec: Spec, rows: Split) -> None:
        """Before the evaluate stage evaluates the eval split `rows`."""
        ...

    def deal(self, rows: Split, order: GlobalOrder, dealing: Dealing) -> Iterator[BatchT]:
        """This rank's micro-batches of an optimizer step."""
        ...

    def begin_step(self, policy: Policy, batches: Sequence[BatchT], dist: Dist) -> ScopeT:
        """The step's scope: the global batch's counts (all-reduced) that micro_batch and end_step divide by."""
        ...

    def micro_batch(self, policy: Policy, batch: BatchT, scope: ScopeT) -> MicroLoss[SumsT]:
        """A micro-batch's loss, scaled for backward, and its sums."""
        ...

    def end_step(self, sums: SumsT, scope: ScopeT) -> StepResult:
        """The step's result from the sums of every micro-batch of every rank."""
        ...

    def evaluate(
        self, model: torch.nn.Module, rows: Split, indices: Sequence[int], dist: Dist, options: EvalOptions
    ) -> Metrics:
        """Its evaluation metrics over the rows `indices` of the eval split `rows`, equal on any world size."""
        ...

    def eval_fields(self) -> Metrics:
        """What eval.json records of it beside its metrics."""
        ...

    def summary(self, result: Metrics) -> str:
        """The evaluation's log line."""
        ...

    def state_dict(self) -> dict[str, Any] | None:
        """What a checkpoint keeps of it (None: nothing)."""
        ...

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """What a checkpoint kept of it (None: nothing was)."""
        ...


def held_data(rows: Split) -> DataKind:
    """What a non-empty split holds: supervised rows, pairs, KTO feedback or prompts (one kind a dataset:
    staging/stage.py)."""
    if rows.prompts:
        return PROMPT_DATA
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
