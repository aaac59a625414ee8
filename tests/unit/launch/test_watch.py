"""Following a training phase: new steps of metrics.jsonl reported once each (a file rewritten on resume read again
from the top), and a stall, no new step for launch.stall_timeout, a retryable error naming the rank whose heartbeat
is the oldest."""

from __future__ import annotations

import json
import time

import pytest

from core.errors import RetryableError
from launch import watch as watch_module
from launch.watch import Watch
from storage.location import Location


def write(path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_each_new_step_is_reported_once(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(watch_module, "READ_EVERY_S", 0.0)
    metrics, seen = tmp_path / "metrics.jsonl", []
    watch = Watch(Location(str(metrics)), {}, stall_timeout=60, startup_grace=60, on_progress=seen.append)
    watch.poll()  # no file yet
    write(metrics, [{"step": 1, "loss": 2.0}, {"event": "straggler", "step": 1}])
    watch.poll()
    write(metrics, [{"step": 1, "loss": 2.0}, {"event": "straggler", "step": 1}, {"step": 2, "loss": 1.9}])
    watch.poll()
    watch.poll()
    write(metrics, [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.9}, {"step": 3, "loss": 1.8}][:1])  # resumed
    watch.poll()
    write(metrics, [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.85}, {"step": 3, "loss": 1.8}])
    watch.poll()
    assert [record["step"] for record in seen] == [1, 2, 3] and watch.last_step == 3


def test_a_stall_names_the_rank_with_the_oldest_heartbeat(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(watch_module, "READ_EVERY_S", 0.0)
    beats = {0: tmp_path / "node0", 1: tmp_path / "node1"}
    now = time.time()
    for node, directory in beats.items():
        directory.mkdir()
        for rank, age in ((2 * node, 1), (2 * node + 1, 30 if node == 1 else 2)):
            (directory / f"rank-{rank}.beat").write_text(f"7 {now - age:.3f}\n")
    metrics = tmp_path / "metrics.jsonl"
    write(metrics, [{"step": 7, "loss": 1.0}])
    watch = Watch(Location(str(metrics)), {n: str(d) for n, d in beats.items()}, 0.2, 60, lambda _: None)
    watch.poll()
    assert watch.last_step == 7  # past the first step: no start-up grace any more
    time.sleep(0.3)
    with pytest.raises(RetryableError) as info:
        watch.poll()
    message = str(info.value)
    assert message.startswith("training stalled: no new step for 0 s (launch.stall_timeout=0; last step 7); ")
    assert "node 1 rank 3 is the slowest: last heartbeat 30 s ago, in step 7" in message


def test_the_first_step_gets_the_start_up_grace(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(watch_module, "READ_EVERY_S", 0.0)
    watch = Watch(Location(str(tmp_path / "metrics.jsonl")), {}, 0.1, 60, lambda _: None)
    time.sleep(0.2)
    watch.poll()  # no step yet: stall_timeout + the rendezvous timeout
    late = Watch(Location(str(tmp_path / "metrics.jsonl")), {}, 0.1, 0.0, lambda _: None)
    time.sleep(0.2)
    with pytest.raises(RetryableError, match="no rank has started a step yet"):
        late.poll()
