"""metrics.jsonl, rank 0's log of steps and events: one JSON line per logged step, appended locally and rewritten
whole on an object store; a resumed run drops what the failed attempt wrote after its checkpoint; other ranks write
nothing."""

from __future__ import annotations

import json

from storage.fs import read_bytes
from storage.location import Location, join
from trainer.metrics import MetricsWriter, host_memory

STEP = {"max_steps": 4, "loss": 2.0, "lr": 1e-4, "grad_norm": 0.5, "tokens": 100, "padding_fraction": 0.1}
STEP |= {"tokens_per_s": 1000.0}


def lines(url) -> list[dict]:
    return [json.loads(line) for line in read_bytes(url).decode().splitlines()]


def check_resume(run: Location, caplog) -> None:
    with caplog.at_level("INFO", logger="trainer.metrics"):
        writer = MetricsWriter(run, enabled=True, start_step=0)
        for step in (1, 2, 3):
            writer.write({**STEP, "step": step})
        writer.write({"event": "straggler", "step": 3, "rank": 1})
    assert "step 3/4 loss 2.0000 lr 1.00e-04 grad_norm 0.500 tokens 100 (padding 10.0%) tokens/s 1000" in caplog.text
    resumed = MetricsWriter(run, enabled=True, start_step=2)  # the checkpoint of step 2: lines after it go
    assert [(r["step"], r.get("event")) for r in lines(resumed.url)] == [(1, None), (2, None)]
    resumed.write({**STEP, "step": 3})
    assert [r["step"] for r in lines(join(run, "metrics.jsonl"))] == [1, 2, 3]


def test_steps_are_lines_and_a_resume_drops_the_failed_attempts_tail(tmp_path, caplog) -> None:
    check_resume(Location(str(tmp_path / "run")), caplog)


def test_on_an_object_store_the_file_is_rewritten_whole(s3_bucket, caplog) -> None:
    check_resume(join(s3_bucket, "runs/r"), caplog)


def test_only_rank_0_writes(tmp_path) -> None:
    MetricsWriter(Location(str(tmp_path)), enabled=False, start_step=0).write({**STEP, "step": 1})
    assert list(tmp_path.iterdir()) == []


def test_host_memory_is_this_processes_resident_memory() -> None:
    memory = host_memory()
    assert set(memory) == {"rss_anon_gb", "rss_file_gb", "peak_rss_gb"}
    assert 0 < memory["rss_anon_gb"] <= memory["peak_rss_gb"]
