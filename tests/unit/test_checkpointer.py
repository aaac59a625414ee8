"""The trainer's checkpoint policy without DeepSpeed: which steps save, what a cancel saves, when retention runs,
what resume returns and that the export is the last step's."""

from __future__ import annotations

from typing import Any

from storage.checkpoints import CompleteCheckpoint
from trainer.checkpointing.policy import Checkpointer, Policy


class FakeIO:
    """Records what the policy asks for; `resumable` is the step a found checkpoint holds."""

    def __init__(self, resumable: int | None = None) -> None:
        self.resumable = resumable
        self.calls: list[tuple[str, Any]] = []

    def find(self) -> CompleteCheckpoint | None:
        if self.resumable is None:
            return None
        return CompleteCheckpoint(f"run/checkpoints/step-{self.resumable:08d}", self.resumable, "d", {})

    def load(self, ckpt: CompleteCheckpoint) -> int:
        self.calls.append(("load", ckpt.step))
        return ckpt.step

    def save(self, step: int) -> int:
        self.calls.append(("save", step))
        return 100 * step

    def retain(self, keep_latest_k: int | None) -> None:
        self.calls.append(("retain", keep_latest_k))

    def export(self, step: int) -> None:
        self.calls.append(("export", step))


def run(checkpointer: Checkpointer, start: int, total: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for step in range(start, total):
        checkpointer.step_done(step + 1, events.append)
    checkpointer.finish()
    return events


def test_saves_every_save_steps_and_the_last_step_then_exports_it() -> None:
    io = FakeIO()
    checkpointer = Checkpointer(io, Policy(save_steps=4, total_steps=10, keep_latest_k=2), is_main=True)
    assert checkpointer.resume() == 0
    events = run(checkpointer, 0, 10)
    assert io.calls == [
        ("save", 4),
        ("retain", 2),
        ("save", 8),
        ("retain", 2),
        ("save", 10),
        ("retain", 2),
        ("export", 10),
    ]
    assert [(e["event"], e["step"], e["bytes"]) for e in events] == [
        ("checkpoint", 4, 400),
        ("checkpoint", 8, 800),
        ("checkpoint", 10, 1000),
    ]


def test_only_rank_0_applies_retention() -> None:
    io = FakeIO()
    run(Checkpointer(io, Policy(2, 4, 1), is_main=False), 0, 4)
    assert io.calls == [("save", 2), ("save", 4), ("export", 4)]


def test_resume_loads_the_found_checkpoint_and_continues_from_its_step() -> None:
    io = FakeIO(resumable=8)
    checkpointer = Checkpointer(io, Policy(4, 12, None), is_main=True)
    assert checkpointer.resume() == 8
    run(checkpointer, 8, 12)
    assert io.calls == [("load", 8), ("save", 12), ("retain", None), ("export", 12)]


def test_cancel_saves_unsaved_steps_only() -> None:
    io = FakeIO()
    checkpointer = Checkpointer(io, Policy(4, 12, None), is_main=True)
    checkpointer.resume()
    checkpointer.cancelled(6)  # steps 5-6 are not in the step-4 checkpoint
    checkpointer.cancelled(8)  # step 8 was saved by the interval
    assert io.calls == [("save", 6)]


def test_cancel_right_after_resume_saves_nothing() -> None:
    io = FakeIO(resumable=6)
    checkpointer = Checkpointer(io, Policy(4, 12, None), is_main=True)
    checkpointer.cancelled(checkpointer.resume())
    assert io.calls == [("load", 6)]
