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
    log = (
        "2026-11-21 23:40:00,000 [rank 1/2 vm] ERROR trainer: data.source x.json: no records\n"
        + TORCHRUN_REPORT.replace("137 (pid", "2 (pid")
    )
    assert failure_summary(log) == ("rank 1: data.source x.json: no records", 2)


def test_no_report_at_all() -> None:
    assert failure_summary("Killed\n") == ("see the log", None)


# A rank of node 1 whose peer on node 0 advertised 127.0.0.1 (captured from two network namespaces without an
# interface variable: the machine's hostname resolves to 127.0.0.1).
GLOO_LOOPBACK = """[/gloo/transport/tcp/debug_logger.cc:9] ERROR failed to connect, willRetry=0, retry=4, \
retryLimit=3, rank=1, size=2, local=[127.0.0.1]:17027, remote=[127.0.0.1]:11170$1, error=SO_ERROR: Connection refused, \
remote=[127.0.0.1]:11170$1
RuntimeError: Gloo connectFullMesh failed with [/gloo/transport/tcp/pair.cc:152] timed out connecting: SO_ERROR: \
Connection refused, remote=[127.0.0.1]:11170$1
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_18:58:45
  host      : localhost
  rank      : 1 (local_rank: 0)
  exitcode  : 1 (pid: 16723)
  error_file: <N/A>
"""


def test_a_rank_that_cannot_reach_a_loopback_peer_is_told_why() -> None:
    summary, code = failure_summary(GLOO_LOOPBACK)
    assert code == 1
    assert summary.startswith(
        "rank 1 exited with code 1: cannot connect to its peer at 127.0.0.1:11170 from "
        "127.0.0.1:17027 (timed out connecting: SO_ERROR: Connection refused); likely cause: a "
        "node advertised a loopback address"
    )


def test_a_refused_connection_and_a_timeout_get_their_own_causes() -> None:
    refused, _ = failure_summary(GLOO_LOOPBACK.replace("127.0.0.1", "10.0.0.7"))
    assert "peer at 10.0.0.7:11170 from 10.0.0.7:17027" in refused and "nothing listens there" in refused
    nccl = (
        "NCCL WARN socketStartConnect: Connect to 10.0.0.9<43211> failed : Connection timed out\n"
        + GLOO_LOOPBACK.split("Root Cause", 1)[1]
    )
    timed_out, _ = failure_summary("Root Cause" + nccl)
    assert (
        "cannot connect to its peer at 10.0.0.9:43211 (Connection timed out); likely cause: the traffic does "
        "not get through: a firewall" in timed_out
    )


def test_a_rank_that_crashed_connecting_is_told_why_with_both_ends() -> None:
    """Since a rank's uncaught exception is its own error line, gloo's words come back through it: said with both
    ends and the likely cause, not as the exception's text."""
    crash = (
        "2026-11-23 18:58:45,000 [rank 1/2 vm] ERROR trainer: RuntimeError in init (trainer/distributed.py:80): Gloo "
        "connectFullMesh failed with [/gloo/transport/tcp/pair.cc:152] timed out connecting: SO_ERROR: Connection "
        "refused, remote=[127.0.0.1]:11170$1\n"
    )
    summary, _ = failure_summary(GLOO_LOOPBACK + crash)
    assert summary.startswith("rank 1: cannot connect to its peer at 127.0.0.1:11170 from 127.0.0.1:17027 (")
    other = crash.replace("Gloo connectFullMesh failed with", "shape mismatch in")
    assert failure_summary(GLOO_LOOPBACK + other)[0].startswith("rank 1: RuntimeError in init")
