"""The trainer's checkpoint policy without DeepSpeed: which steps save, what a cancel saves, when retention runs,
what resume returns, that the export is the last step's, and that a background save is waited for (one in flight,
recorded and retained only once it finished, left alone when a stop's grace runs out)."""

from __future__ import annotations

import time
from typing import Any

from storage.checkpoints import CompleteCheckpoint
from trainer.checkpointing.policy import Checkpointer, Policy
from trainer.checkpointing.writer import SaveResult


class FakeSave:
    """A save that finishes when the test says (`background`) or at once."""

    def __init__(self, step: int, calls: list[tuple[str, Any]], *, background: bool) -> None:
        self.step, self.calls, self.finished = step, calls, not background

    def done(self) -> bool:
        return self.finished

    def wait(self, timeout: float | None = None) -> SaveResult | None:
        if not self.finished and timeout is not None:
            return None
        if not self.finished:
            self.calls.append(("waited", self.step))
            self.finished = True
        return SaveResult(self.step, True, 100 * self.step, time.perf_counter())


class FakeIO:
    """Records what the policy asks for; `resumable` is the step a found checkpoint holds."""

    def __init__(self, resumable: int | None = None, *, background: bool = False) -> None:
        self.resumable, self.background = resumable, background
        self.calls: list[tuple[str, Any]] = []
        self.saves: list[FakeSave] = []

    def find(self) -> CompleteCheckpoint | None:
        if self.resumable is None:
            return None
        return CompleteCheckpoint(f"run/checkpoints/step-{self.resumable:08d}", self.resumable, "d", {})

    def load(self, ckpt: CompleteCheckpoint) -> int:
        self.calls.append(("load", ckpt.step))
        return ckpt.step

    def start_save(self, step: int) -> FakeSave:
        self.calls.append(("save", step))
        self.saves.append(FakeSave(step, self.calls, background=self.background))
        return self.saves[-1]

    def agree(self, mine: bool) -> bool:
        return mine

    def retain(self, keep_latest_k: int | None) -> None:
        self.calls.append(("retain", keep_latest_k))

    def export(self, step: int) -> None:
        self.calls.append(("export", step))


def run(checkpointer: Checkpointer, start: int, total: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for step in range(start, total):
        checkpointer.step_done(step + 1, events.append)
    checkpointer.finish(events.append)
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
    assert io.calls == [("save", 6), ("retain", None)]  # retention follows every completed save


def test_cancel_right_after_resume_saves_nothing() -> None:
    io = FakeIO(resumable=6)
    checkpointer = Checkpointer(io, Policy(4, 12, None), is_main=True)
    checkpointer.cancelled(checkpointer.resume())
    assert io.calls == [("load", 6)]


def test_a_background_save_is_recorded_and_retained_once_finished_and_the_next_waits_for_it() -> None:
    io = FakeIO(background=True)
    checkpointer = Checkpointer(io, Policy(save_steps=2, total_steps=6, keep_latest_k=1), is_main=True)
    events: list[dict[str, Any]] = []
    checkpointer.step_done(2, events.append)
    checkpointer.step_done(3, events.append)  # still in flight: nothing recorded, nothing retained
    assert io.calls == [("save", 2)] and events == []
    io.saves[0].finished = True
    checkpointer.step_done(3, events.append)  # seen at the next step boundary
    assert io.calls == [("save", 2), ("retain", 1)] and [e["step"] for e in events] == [2]
    checkpointer.step_done(4, events.append)
    checkpointer.step_done(6, events.append)  # step 4's save is still running: the next one waits for it
    assert io.calls[2:] == [("save", 4), ("waited", 4), ("retain", 1), ("save", 6)]
    checkpointer.finish(events.append)  # the last save is waited for before the export
    assert io.calls[-3:] == [("waited", 6), ("retain", 1), ("export", 6)]
    assert [e["step"] for e in events] == [2, 4, 6]


def test_a_stop_past_its_grace_leaves_the_save_in_flight_and_starts_no_other() -> None:
    io = FakeIO(background=True)
    checkpointer = Checkpointer(io, Policy(4, 12, None), is_main=True)
    checkpointer.step_done(4, lambda _: None)
    checkpointer.cancelled(6, since_signal=30.0, grace_s=20)  # no time left: step 4 stays in flight, 6 unsaved
    assert io.calls == [("save", 4)]


def test_a_stop_waits_for_the_save_in_flight_then_saves_its_own_step() -> None:
    io = FakeIO(background=True)
    checkpointer = Checkpointer(io, Policy(4, 12, None), is_main=True)
    events: list[dict[str, Any]] = []
    checkpointer.step_done(4, events.append)
    checkpointer.cancelled(6, record=events.append)  # no grace configured: wait as long as it takes
    assert io.calls == [("save", 4), ("waited", 4), ("retain", None), ("save", 6), ("waited", 6), ("retain", None)]
    assert [(e["step"], e.get("reason")) for e in events] == [(4, None), (6, "sigterm")]
