"""tools/install.sh's choice of Python, on a PATH of stand-in interpreters (scripts that print a version): python3.11
where it exists, else the newest of python3.13 and python3.12, else python3; $PYTHON over all of them; anything but
3.11, 3.12 or 3.13 refused in one line with exit 2, no traceback and no .venv. The script runs from a copy in a
temporary checkout, so the repository's own .venv is not the answer."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASH = shutil.which("bash") or "/bin/bash"
# What the script runs before it has a Python (the rest are bash's own built-ins).
TOOLS = ("dirname",)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A checkout holding only tools/install.sh."""
    (tmp_path / "repo" / "tools").mkdir(parents=True)
    shutil.copy(ROOT / "tools" / "install.sh", tmp_path / "repo" / "tools" / "install.sh")
    return tmp_path / "repo"


def interpreters(folder: Path, **versions: str) -> str:
    """A PATH holding a stand-in for each name (python3_12="3.12.1" is python3.12) that prints its version, and the
    few tools the script needs before it has a Python."""
    folder.mkdir()
    for name, version in versions.items():
        script = folder / name.replace("_", ".")
        script.write_text(f"#!/bin/sh\necho {version}\n")
        script.chmod(0o755)
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} not found"
        (folder / tool).symlink_to(found)
    return str(folder)


def install(checkout: Path, path: str, *args: str, python: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": path, "HOME": str(checkout.parent)}
    if python is not None:
        env["PYTHON"] = python
    return subprocess.run(
        [BASH, str(checkout / "tools" / "install.sh"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("found", "chosen"),
    [
        ({"python3_11": "3.11.7", "python3_12": "3.12.1", "python3_13": "3.13.0"}, "python3.11 3.11.7"),
        ({"python3_12": "3.12.1", "python3_13": "3.13.0"}, "python3.13 3.13.0"),
        ({"python3_12": "3.12.1"}, "python3.12 3.12.1"),
        ({"python3_13": "3.13.0", "python3": "3.12.3"}, "python3.13 3.13.0"),
        ({"python3": "3.12.3"}, "python3 3.12.3"),
    ],
)
def test_it_takes_python3_11_else_the_newest_of_3_13_and_3_12(
    checkout: Path, tmp_path: Path, found: dict[str, str], chosen: str
) -> None:
    result = install(checkout, interpreters(tmp_path / "bin", **found), "--which-python")
    assert (result.returncode, result.stdout.strip(), result.stderr) == (0, chosen, "")


def test_python_set_wins_over_what_the_path_holds(checkout: Path, tmp_path: Path) -> None:
    path = interpreters(tmp_path / "bin", python3_11="3.11.7", python3_12="3.12.1", python3_13="3.13.0")
    result = install(checkout, path, "--which-python", python="python3.12")
    assert (result.returncode, result.stdout.strip()) == (0, "python3.12 3.12.1")


@pytest.mark.parametrize("args", [("--which-python",), ()])
def test_an_unsupported_python_is_one_line_naming_the_supported_ones(
    checkout: Path, tmp_path: Path, args: tuple[str, ...]
) -> None:
    result = install(checkout, interpreters(tmp_path / "bin", python3="3.10.14"), *args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "setup: Python 3.10.14 (python3) is not supported: Tandem needs Python 3.11, 3.12 or 3.13 "
        "(set PYTHON=python3.11, say)\n"
    )
    assert not (checkout / ".venv").exists()
    refused = install(checkout, interpreters(tmp_path / "bin2", python3_14="3.14.0"), *args, python="python3.14")
    assert refused.returncode == 2 and refused.stderr.startswith("setup: Python 3.14.0 (python3.14) is not supported")


def test_no_python_at_all_or_a_missing_one_is_one_line(checkout: Path, tmp_path: Path) -> None:
    path = interpreters(tmp_path / "bin")
    result = install(checkout, path)
    assert result.returncode == 2 and result.stderr == (
        "setup: no Python found (looked for python3.11, python3.13, python3.12, python3): install Python 3.11, 3.12 "
        "or 3.13, or set PYTHON=/path/to/python3.X\n"
    )
    missing = install(checkout, path, python="python3.12")
    assert missing.returncode == 2 and missing.stderr == (
        "setup: PYTHON=python3.12 is not a command; set it to a Python 3.11, 3.12 or 3.13\n"
    )
    assert "Traceback" not in result.stderr + missing.stderr and not (checkout / ".venv").exists()


def test_an_unknown_option_is_refused(checkout: Path, tmp_path: Path) -> None:
    result = install(checkout, interpreters(tmp_path / "bin", python3_11="3.11.7"), "--devel")
    assert result.returncode == 2 and result.stderr == "setup: unknown option --devel (use --dev or --which-python)\n"
    assert os.listdir(checkout) == ["tools"]
