"""A rank's heartbeat: its step and the time, in one small file of its node's heartbeat directory, replaced whole at
each beat (what launch/watch.py reads to name the slowest rank); without the directory, nothing."""

from __future__ import annotations

import time

from storage.layout import HEARTBEAT_ENV
from trainer.watch.heartbeat import Heartbeat


def test_a_beat_records_the_step_and_the_time(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(HEARTBEAT_ENV, str(tmp_path))
    beat = Heartbeat(3)
    beat.beat(7)
    before = time.time()
    beat.beat(8)
    step, at = (tmp_path / "rank-3.beat").read_text().split()
    # The beat writes milliseconds (`%.3f`), which round up by as much as half of one past the clock it read.
    assert int(step) == 8 and before - 1 <= float(at) <= time.time() + 0.0005
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-3.beat"]  # no temporary file left


def test_without_a_directory_a_beat_writes_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(HEARTBEAT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    Heartbeat(0).beat(1)
    assert list(tmp_path.iterdir()) == []
