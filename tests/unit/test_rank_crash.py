"""How the launcher turns a node's log into the pipeline's error: one line when a rank said why (the rank's line is
tests/unit/trainer/test_crash.py), torchrun's own report of the failure never shown. The whole path, through real
torchrun ranks, is in tests/distributed/test_trainer.py
(`test_a_failure_a_retry_would_repeat_stops_unretried_naming_the_rank[crash]`)."""

from __future__ import annotations

from launch.diagnose import failure_message, without_torchrun_report
from storage.location import Location
from tests.unit.test_failure_summary import TORCHRUN_REPORT


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
    message = failure_message("train", 0, CRASHED, Location("/runs/r/nodes/0/log.txt"))
    assert message == (
        "train failed on node 0, rank 0: TypeError in build_engine (trainer/loop.py:116): int() argument must be a "
        "string, not 'NoneType' (traceback: /runs/r/nodes/0/log.txt)"
    )


def test_a_rank_killed_outright_is_the_cause_not_its_peers_lost_connection() -> None:
    """Rank 1 was killed (no line of its own); rank 0 then lost its connection and said so: an echo, not the cause."""
    echo = (
        "2026-11-25 18:01:45,519 [rank 0/2 vm] ERROR trainer: RuntimeError in dist_sum (trainer/distributed.py:82): "
        "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:44470: Connection reset by peer\n"
    )
    message = failure_message("train", 0, echo + torchrun_report((0, 75), (1, 137)), Location("/r/nodes/0/log.txt"))
    assert message.startswith("train failed on node 0, rank 1 exited with code 137\n"), message


def test_without_a_rank_line_the_tail_shows_the_ranks_lines_not_torchruns_report() -> None:
    text = "[rank1]: something the rank printed\n" + TORCHRUN_REPORT + "after the report\n"
    assert without_torchrun_report(text) == "[rank1]: something the rank printed\nafter the report\n"
    message = failure_message("train", 1, text, Location("/runs/r/nodes/1/log.txt"))
    first, _, rest = message.partition("\n")
    assert first == "train failed on node 1, rank 1 exited with code 137"
    assert "Root Cause" not in rest and "something the rank printed" in rest
