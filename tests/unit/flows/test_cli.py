"""The command lines' shared plumbing, in a process of its own as a CLI runs (it installs its log filters on the root
logger): an error of ours one masked line on stderr with its exit code, Ctrl-C exit 130, --print-config the resolved
config as YAML that --config reads back, and Prefect's console kept from printing what the CLI prints as one line. A
config its launch backend refuses stops the command line, and a flow at its boundary (`enter`), before anything ran."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from config.loader import load_config
from core.errors import UserError
from flows.cli import enter
from tests.conftest import ROOT

CLI = """
import argparse, logging, sys
from core.errors import RetryableError, UserError
from flows.cli import add_config_arguments, run_cli, run_config_cli

logging.basicConfig(format="%(message)s")  # a console handler on the root logger, as Prefect's
what = sys.argv[1]
if what == "config":
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    args = parser.parse_args(sys.argv[2:])
    sys.exit(run_config_cli(args, args.overrides, lambda cfg: print("ran", cfg.train.max_steps) or 0))

def body():
    if what == "user":
        raise UserError("data.source: /nope.jsonl does not exist; token=hf_abcdefghijklmnopqrstu\\nsecond line")
    if what == "retry":
        raise RetryableError("node 1 lost")
    if what == "interrupt":
        raise KeyboardInterrupt
    logging.getLogger("prefect.flow_runs").error("Finished in state Failed('UserError: x')")
    logging.getLogger("prefect.flow_runs").error("a prefect error of its own")
    return 0

sys.exit(run_cli(body))
"""


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_errors_are_one_masked_line_and_their_exit_code() -> None:
    user = cli("user")
    assert user.returncode == 2
    assert user.stderr == "error: data.source: /nope.jsonl does not exist; token=***\nsecond line\n"
    retry = cli("retry")
    assert (retry.returncode, retry.stderr) == (75, "error: node 1 lost\n")
    interrupted = cli("interrupt")
    assert (interrupted.returncode, interrupted.stderr) == (130, "interrupted\n")


def test_prefects_console_keeps_quiet_about_our_errors_only() -> None:
    logs = cli("logs")
    assert logs.returncode == 0 and "a prefect error of its own" in logs.stderr and "UserError" not in logs.stderr


def test_print_config_prints_the_resolved_config_that_config_reads_back(tmp_path) -> None:
    printed = cli("config", "--config", "tiny-cpu", "--set", "train.max_steps=9", "--print-config")
    assert printed.returncode == 0, printed.stderr
    (tmp_path / "resolved.yaml").write_text(printed.stdout)
    assert yaml.safe_load(printed.stdout)["train"]["max_steps"] == 9
    assert load_config(str(tmp_path / "resolved.yaml")) == load_config("tiny-cpu", ["train.max_steps=9"])
    ran = cli("config", "--set", "train.max_steps=4")
    assert (ran.returncode, ran.stdout) == (0, "ran 4\n")
    bad = cli("config", "--set", "train.max_steps=-1")
    assert bad.returncode == 2 and bad.stderr.startswith("error: config tiny-cpu.yaml with --set: train.max_steps:")


ELASTIC_ON_SLURM = ["launch.backend=slurm", "launch.nnodes=3", "launch.min_nnodes=2", "train.global_batch_size=24"]
SLURM_REFUSES = (
    "launch.min_nnodes/max_nnodes: only launch.backend=local, ssh or kubernetes picks the surviving nodes so far, not "
    "slurm; leave them empty (every node must come back)"
)


def test_a_config_its_launch_backend_refuses_is_one_line_and_exit_2_before_anything_runs() -> None:
    """The backend decides (launch/phase.py `run_backend`), as the config did before: on the command line, and at the
    flow's boundary for a config from the UI form, which no command line checked."""
    refused = cli("config", *(arg for setting in ELASTIC_ON_SLURM for arg in ("--set", setting)))
    assert (refused.returncode, refused.stdout, refused.stderr) == (2, "", f"error: {SLURM_REFUSES}\n")
    with pytest.raises(UserError) as at_the_boundary:
        enter(load_config(None, ELASTIC_ON_SLURM))
    assert str(at_the_boundary.value) == SLURM_REFUSES
