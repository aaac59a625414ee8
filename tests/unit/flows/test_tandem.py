"""The `tandem` command: each word runs its module's own main() with the same arguments, so `tandem X ...` and
`python -m flows.X ...` (`tandem node`: `python -m launch.node`) print the same and exit the same; the installed
console script is that command."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flows import finetune, prepare, registry, submit
from flows.tandem import COMMANDS, main
from launch import node
from tests.conftest import ROOT

MAINS = {"finetune": finetune.main, "prepare": prepare.main, "registry": registry.main, "submit": submit.main}
MAINS |= {"node": node.main}
MODULES = {command: f"flows.{command}" for command in MAINS} | {"node": "launch.node"}  # a node imports no Prefect


def outcome(entry, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int | str | None, str, str]:
    """(exit code, stdout, stderr) of a main() called in this process, argparse's SystemExit included."""
    try:
        code: int | str | None = entry(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", sorted(MAINS))
def test_each_command_is_its_modules_main(command: str, capsys) -> None:
    assert COMMANDS[command][0] == MODULES[command] and COMMANDS[command][1] == ()
    assert outcome(lambda a: main([command, *a]), ["--help"], capsys) == outcome(MAINS[command], ["--help"], capsys)
    wrong = ["--no-such-option"]
    assert outcome(lambda a: main([command, *a]), wrong, capsys) == outcome(MAINS[command], wrong, capsys)


def test_plan_and_finetune_read_the_same_config(tmp_path: Path, capsys) -> None:
    settings = ["--print-config", "--set", "train.max_steps=7", "--set", f"run.storage={tmp_path}"]
    printed = outcome(finetune.main, ["--plan", *settings], capsys)
    assert printed[0] == 0 and "max_steps: 7" in printed[1]
    assert outcome(main, ["plan", *settings], capsys) == printed
    assert outcome(main, ["finetune", *settings], capsys) == outcome(finetune.main, settings, capsys)


def test_help_lists_every_command_and_a_wrong_one_is_one_line(capsys) -> None:
    code, out, _ = outcome(main, ["--help"], capsys)
    assert code == 0 and all(f"  {name} " in out for name in COMMANDS)
    assert "(python -m flows.finetune --plan)" in out
    code, _, err = outcome(main, ["train"], capsys)
    assert code == 2 and err == (
        "tandem: unknown command 'train'; one of: finetune, plan, prepare, registry, submit, node (tandem --help)\n"
    )
    assert outcome(main, [], capsys)[0] == 2


def test_the_installed_console_script_is_the_command() -> None:
    script = Path(sys.executable).parent / "tandem"
    assert script.exists() or shutil.which("tandem"), "pip install -e . installs the tandem script"
    done = subprocess.run([str(script), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "registry" in done.stdout and "python -m flows.submit" in done.stdout
    version = subprocess.run([str(script), "--version"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert version.stdout.startswith("tandem 0.") and version.returncode == 0
