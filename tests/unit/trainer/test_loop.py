"""trainer/loop.py's pieces that need no DeepSpeed engine: `step_record` is a logged step's metrics.jsonl line, its
rates computed and a missing grad norm written as 0. The loop itself, on real engines and ranks, is
tests/distributed/test_trainer.py."""

from __future__ import annotations

import torch

from trainer.loop import step_record
from trainer.metrics import StepStats


class Engine:
    """What step_record reads of a DeepSpeed engine: its scheduler's rates and the last step's gradient norm."""

    def __init__(self, lr: float, grad_norm: float | torch.Tensor | None) -> None:
        self.lr, self.grad_norm = lr, grad_norm

    def get_lr(self) -> list[float]:
        return [self.lr, self.lr / 10]  # one rate per parameter group: the first is recorded

    def get_global_grad_norm(self) -> float | torch.Tensor | None:
        return self.grad_norm


def test_a_logged_step_is_one_metrics_line() -> None:
    stats = StepStats(loss=2.5, target_tokens=300, tokens=800, padding_fraction=0.2, compute_s=1.5)
    record = step_record(Engine(3e-4, torch.tensor(0.75)), stats, (10, 30), 2.0, 0.25)
    record.pop("peak_memory_gb", None)  # on a GPU only
    assert record == {
        "step": 10,
        "max_steps": 30,
        "loss": 2.5,
        "lr": 3e-4,
        "grad_norm": 0.75,
        "target_tokens": 300,
        "tokens": 800,
        "tokens_per_s": 400.0,
        "step_time_s": 2.0,
        "data_time_s": 0.25,
        "padding_fraction": 0.2,
    }
    assert isinstance(record["grad_norm"], float)  # a tensor would not serialise to JSON
    assert step_record(Engine(1e-3, None), stats, (1, 30), 0.5, 0.0)["grad_norm"] == 0.0  # before DeepSpeed has one
