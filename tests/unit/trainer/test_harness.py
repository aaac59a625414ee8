"""The life of one rank, run in a process of its own as torchrun runs it (a group of one): spec.json read and
validated, the faults a test injects read from the environment and handed to the body, the body run, a user's error
one line on the rank's error logger with its exit code, anything else a crash line, and the process group left
whatever happened."""

from __future__ import annotations

import subprocess
import sys

from core.errors import EXIT_USER_ERROR
from core.rank_log import rank_errors
from storage.spec import publish_spec
from tests.conftest import ROOT
from tests.specs import spec_for

RANK = """
import sys
import torch.distributed
from core.errors import UserError
from storage.location import Location
from trainer.harness import run_rank

def works(spec, dist, faults):
    print("ran", spec.run_id, "on rank", dist.rank, "of", dist.world_size, "slow", faults.slow, flush=True)

def fails(spec, dist, faults):
    raise UserError("data.max_length must be > 0, got 0")

def crashes(spec, dist, faults):
    raise ValueError("boom")

for url, body in ((sys.argv[1], works), (sys.argv[1], fails), (sys.argv[1], crashes), (sys.argv[2], works)):
    code = run_rank(Location(url), body, deepspeed_backend=False)
    print("exit", code, "group left" if not torch.distributed.is_initialized() else "group held", flush=True)
"""


def test_a_rank_runs_its_body_and_turns_errors_into_one_line_and_an_exit_code(tmp_path) -> None:
    written = publish_spec(spec_for(tmp_path, []))
    missing = tmp_path / "nowhere" / "spec.json"
    done = subprocess.run(
        [sys.executable, "-c", RANK, str(written.url), str(missing)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "TANDEM_TEST_SLOW_RANK": "1:0.5"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "ran r on rank 0 of 1 slow At(rank=1, amount=0.5)",  # the faults read from the environment, once
        "exit 0 group left",
        f"exit {EXIT_USER_ERROR} group left",
        f"exit {EXIT_USER_ERROR} group left",  # a plain bug is not worth a retry
        f"exit {EXIT_USER_ERROR} group left",
    ]
    errors = [message for _, message in rank_errors(done.stderr)]
    assert errors[0] == "data.max_length must be > 0, got 0"
    assert errors[1].startswith("ValueError") and errors[1].endswith(": boom")
    assert "Traceback" in done.stderr  # the crash's traceback stays in the node's log, after its one line
    # Before the group exists, the error still goes out (as the launcher reads it: ERROR trainer: ...).
    assert f"--spec {missing}: no such file; pass the spec.json of a run" in done.stderr
