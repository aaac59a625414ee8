"""The CLI as users run it: `--help`, and bad input giving one line, a non-zero exit, and nothing written."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli


def test_help_lists_the_options() -> None:
    result = run_cli("flows.finetune", "--help")
    assert result.returncode == 0
    assert "--config FILE" in result.stdout and "--set KEY=VALUE" in result.stdout


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
