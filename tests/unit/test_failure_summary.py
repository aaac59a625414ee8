"""Which rank failed and why, read from a node's log the way the launcher reads it."""

from __future__ import annotations

from launch.diagnose import failure_summary

TORCHRUN_REPORT = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
trainer FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-21_23:40:01
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 137 (pid: 4242)
  error_file: <N/A>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-21_23:40:01
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 4241)
  error_file: <N/A>
============================================================
"""


def test_the_rank_torchrun_terminated_is_not_the_culprit() -> None:
    assert failure_summary(TORCHRUN_REPORT) == ("rank 1 exited with code 137", 137)


def test_a_ranks_own_error_line_wins() -> None:
    log = "2026-11-21 23:40:00,000 [rank 1/2 vm] ERROR trainer: data.source x.json: no records\n" + \
        TORCHRUN_REPORT.replace("137 (pid", "2 (pid")
    assert failure_summary(log) == ("rank 1: data.source x.json: no records", 2)


def test_no_report_at_all() -> None:
    assert failure_summary("Killed\n") == ("see the log", None)
