"""The import directions of docs/architecture.md: flows -> tasks -> launch/storage/config; trainer -> storage/config;
nothing under trainer/, storage/ or config/ imports prefect; config/ imports no torch and no fsspec."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = {"config", "storage", "launch", "trainer", "tasks", "flows"}


def imported_roots(package: str) -> dict[str, set[str]]:
    """Top-level module names imported anywhere in a package, per file."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


def test_required_top_level_exists() -> None:
    for name in ("pyproject.toml", "README.md", "flows", "tasks", "trainer", "config", "storage", "launch", "tests",
                 "docker", "docs/architecture.md"):
        assert (ROOT / name).exists(), name


@pytest.mark.parametrize(("package", "forbidden"), [
    ("config", {"torch", "deepspeed", "fsspec", "s3fs", "prefect", "storage", "launch", "trainer", "tasks", "flows"}),
    ("storage", {"prefect", "torch", "deepspeed", "launch", "trainer", "tasks", "flows"}),
    ("trainer", {"prefect", "launch", "tasks", "flows"}),
    ("launch", {"torch", "deepspeed", "trainer", "tasks", "flows"}),
    ("tasks", {"flows", "trainer"}),
    ("flows", {"trainer"}),
])
def test_imports_point_down(package: str, forbidden: set[str]) -> None:
    offenders = {path: sorted(names & forbidden) for path, names in imported_roots(package).items()
                 if names & forbidden}
    assert not offenders, f"{package}/ must not import {sorted(forbidden)}: {offenders}"


def test_tasks_are_thin() -> None:
    """Every module directly under tasks/ defines a Prefect task (tasks/data/ holds the staging library)."""
    plain = [path.name for path in (ROOT / "tasks").glob("*.py")
             if path.name != "__init__.py" and not re.search(r"^\s*@(task|materialize)\b", path.read_text(), re.M)]
    assert not plain, f"tasks/ holds only @task modules; move these to the package they belong to: {plain}"
