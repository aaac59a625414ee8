"""The CLI as users run it: `--help` (ending with where the configuration reference is), `--print-config`,
`--dry-run`, and bad input giving one line, a non-zero exit, and nothing written."""

from __future__ import annotations

import pytest
import yaml

from config.loader import load_config
from config.schema import FinetuneConfig
from tests.conftest import ROOT, run_cli


def test_help_lists_the_options_and_ends_with_the_reference() -> None:
    result = run_cli("flows.finetune", "--help")
    assert result.returncode == 0
    assert "--config FILE" in result.stdout and "--set KEY=VALUE" in result.stdout and "--print-config" in result.stdout
    last = result.stdout.strip().splitlines()[-1]
    assert "docs/reference/configuration.md" in last and "make docs" in last
    assert (ROOT / "docs/reference/configuration.md").is_file()


def test_print_config_prints_the_resolved_config_and_runs_nothing(tmp_path) -> None:
    storage = tmp_path / "storage"
    overrides = ["train.max_steps=7", f"run.storage={storage}"]
    result = run_cli("flows.finetune", *(f"--set={o}" for o in overrides), "--print-config", timeout=120)
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    assert list(printed) == list(FinetuneConfig.model_fields)  # every section, in the schema's order
    assert printed["train"]["max_steps"] == 7  # the override
    assert printed["train"]["learning_rate"] == 0.003  # the preset (tiny-cpu)
    assert printed["launch"]["retries"] == 0  # a default
    assert printed["data"]["source"] == str(ROOT / "data" / "sample" / "conversations.json")  # resolved as a run does
    assert printed["deepspeed"]["config"] == str(ROOT / "config" / "deepspeed" / "zero2.json")
    assert not storage.exists()
    # What it prints is a config: read back with --config it is the same config.
    (tmp_path / "printed.yaml").write_text(result.stdout)
    assert load_config(str(tmp_path / "printed.yaml")) == load_config(None, overrides)


def test_dry_run_prints_what_the_backend_would_start_and_writes_nothing(tmp_path) -> None:
    """Any backend: here SLURM's job scripts, which a run writes under its directory and a dry run only prints."""
    storage = tmp_path / "storage"
    settings = [f"run.storage={storage}", "run.name=r1", "launch.backend=slurm", "launch.nnodes=3"]
    result = run_cli("flows.finetune", *(f"--set={s}" for s in settings), "--dry-run", timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("# Dry run of launch.backend=slurm: nothing was started or written.")
    for phase in ("train", "eval"):
        assert f"# launch.backend=slurm: sbatch --parsable {storage}/runs/r1/slurm/{phase}.sbatch" in result.stdout
    assert result.stdout.count("#SBATCH --nodes=3") == 2 and "--spec-digest SPEC-DIGEST" in result.stdout
    assert not storage.exists()


def test_print_config_with_a_bad_value_is_one_line_and_exit_2() -> None:
    result = run_cli("flows.finetune", "--set", "launch.nnodes=0", "--print-config", timeout=120)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "error: config tiny-cpu.yaml with --set: launch.nnodes: Input should be greater than 0 (got 0)"
    ]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "train.learning_rate=-1",
            "error: config tiny-cpu.yaml with --set: train.learning_rate: Input should be greater than 0",
        ),
        ("train.no_such_key=1", "train.no_such_key: unknown key (allowed here: method, learning_rate"),
        ("data.source=missing.jsonl", "data.source: "),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, override: str, expected: str) -> None:
    storage = tmp_path / "storage"
    result = run_cli("flows.finetune", "--set", override, "--set", f"run.storage={storage}", timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert not storage.exists()
