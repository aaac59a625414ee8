"""Which rank failed and why, read from a node's log the way the launcher reads it."""

from __future__ import annotations

from launch.diagnose import (
    agent_failure_message,
    agent_signal,
    failure_message,
    failure_summary,
    without_torchrun_report,
)
from launch.job import EVAL, TRAIN
from launch.signals import Death
from storage.location import Location

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
        "2026-11-23 18:58:45,000 [rank 1/2 vm] ERROR trainer: RuntimeError in init "
        "(trainer/parallel/distributed.py:80): Gloo "
        "connectFullMesh failed with [/gloo/transport/tcp/pair.cc:152] timed out connecting: SO_ERROR: Connection "
        "refused, remote=[127.0.0.1]:11170$1\n"
    )
    summary, _ = failure_summary(GLOO_LOOPBACK + crash)
    assert summary.startswith("rank 1: cannot connect to its peer at 127.0.0.1:11170 from 127.0.0.1:17027 (")
    other = crash.replace("Gloo connectFullMesh failed with", "shape mismatch in")
    assert failure_summary(GLOO_LOOPBACK + other)[0].startswith("rank 1: RuntimeError in init")


def torchrun_report(failed: tuple[int, int], root: tuple[int, int]) -> str:
    """torchrun's report of a failed job: one other failure (rank, exit code), then the root cause."""

    def entry(rank: int, code: int) -> str:
        return (
            f"[0]:\n  time      : 2026-11-25_18:01:45\n  host      : localhost\n"
            f"  rank      : {rank} (local_rank: {rank})\n  exitcode  : {code} (pid: 4242)\n  error_file: <N/A>\n"
        )

    rule = "=" * 60
    return (
        f"torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n{rule}\ntrainer FAILED\n{'-' * 60}\n"
        f"Failures:\n{entry(*failed)}{'-' * 60}\nRoot Cause (first observed failure):\n{entry(*root)}{rule}\n"
    )


CRASHED = (
    "2026-11-25 16:04:18,000 [rank 0/2 vm] ERROR trainer.harness: uncaught error on this rank\n"
    "[rank0]: Traceback (most recent call last):\n"
    '[rank0]:   File "/x/trainer/loop.py", line 116, in build_engine\n'
    "[rank0]: TypeError: int() argument must be a string, not 'NoneType'\n"
    "2026-11-25 16:04:18,001 [rank 0/2 vm] ERROR trainer: TypeError in build_engine (trainer/loop.py:116): int() "
    "argument must be a string, not 'NoneType'\n"
    "E1125 16:04:18.815000 16166 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 2) "
    "local_rank: 0 (pid: 16179) of binary: python\n"
    "Traceback (most recent call last):\n"
    '  File "torch/distributed/run.py", line 1032, in <module>\n' + torchrun_report(failed=(1, -15), root=(0, 2))
)


def test_a_crash_is_one_line_pointing_at_the_traceback() -> None:
    message = failure_message(TRAIN, 0, CRASHED, Location("/runs/r/nodes/0/log.txt"))
    assert message == (
        "train failed on node 0, rank 0: TypeError in build_engine (trainer/loop.py:116): int() argument must be a "
        "string, not 'NoneType' (traceback: /runs/r/nodes/0/log.txt)"
    )


def test_a_rank_killed_outright_is_the_cause_not_its_peers_lost_connection() -> None:
    """Rank 1 was killed (no line of its own); rank 0 then lost its connection and said so: an echo, not the cause."""
    echo = (
        "2026-11-25 18:01:45,519 [rank 0/2 vm] ERROR trainer: RuntimeError in dist_sum "
        "(trainer/parallel/distributed.py:82): "
        "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:44470: Connection reset by peer\n"
    )
    message = failure_message(TRAIN, 0, echo + torchrun_report((0, 75), (1, 137)), Location("/r/nodes/0/log.txt"))
    assert message.startswith("train failed on node 0, rank 1 exited with code 137\n"), message


def test_without_a_rank_line_the_tail_shows_the_ranks_lines_not_torchruns_report() -> None:
    text = "[rank1]: something the rank printed\n" + TORCHRUN_REPORT + "after the report\n"
    assert without_torchrun_report(text) == "[rank1]: something the rank printed\nafter the report\n"
    message = failure_message(TRAIN, 1, text, Location("/runs/r/nodes/1/log.txt"))
    first, _, rest = message.partition("\n")
    assert first == "train failed on node 1, rank 1 exited with code 137"
    assert "Root Cause" not in rest and "something the rank printed" in rest


def test_a_rank_killed_by_a_signal_is_one_line_with_its_cause() -> None:
    from launch.signals import Death

    echo = "2026-11-25 18:01:44,000 [rank 0/2 vm] ERROR trainer: RuntimeError: Connection closed by peer\n"
    text = echo + torchrun_report((0, -15), (1, -9))
    log = Location("/runs/r/nodes/1/log.txt")
    message = failure_message(TRAIN, 1, text, log, Death(step=4, rank_bytes=2 * 10**9))
    assert message == (
        "train failed on node 1, rank 1 was killed by SIGKILL (signal 9) after step 4; likely cause: the kernel's "
        "out-of-memory killer sends this; the memory plan said 2.0 GB per rank; check `dmesg` (or `journalctl -k`) on "
        "that node for 'Out of memory: Killed process', then lower train.micro_batch_size or data.max_length, or "
        "give the node more memory (a container's memory limit kills the same way) (log: /runs/r/nodes/1/log.txt)"
    )
    assert failure_summary(torchrun_report((0, -15), (1, -11)))[1] == -11
    assert failure_summary(torchrun_report((0, -15), (1, -11)))[0].startswith("rank 1 was killed by SIGSEGV")


def test_an_agents_signal_is_its_exit_code_or_its_own_last_words() -> None:
    said = "Traceback ...\ntorch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got signal: 15\n"
    assert agent_signal(4242, -9, "") == 9 and agent_signal(4242, -9, said) == 9
    assert agent_signal(4242, 1, said) == 15  # torchrun caught SIGTERM, stopped its ranks and exited 1
    assert agent_signal(4243, 1, said) is None  # another process's words
    assert agent_signal(4242, 0, said) is None and agent_signal(4242, 1, "rank 1 failed") is None
    message = agent_failure_message(EVAL, 0, 4242, 15, Location("/runs/r/nodes/0/log.txt"), Death(step=2))
    assert message.startswith("eval failed on node 0, its torchrun agent (pid 4242) was killed by SIGTERM (signal 15)")
    assert message.endswith(" (log: /runs/r/nodes/0/log.txt)") and "\n" not in message
