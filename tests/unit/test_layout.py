"""The import directions of DESIGN.md: trainer/ never imports prefect, config/ never imports torch,
and config/ imports nothing else of ours."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = {"config", "trainer", "tasks", "flows"}


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
    for name in ("pyproject.toml", "README.md", "flows", "tasks", "trainer", "config", "tests", "docker"):
        assert (ROOT / name).exists(), name


@pytest.mark.parametrize(("package", "forbidden"), [("trainer", {"prefect", "tasks", "flows"}),
                                                   ("config", {"torch", "prefect", "deepspeed", "trainer", "tasks",
                                                               "flows"}),
                                                   ("tasks", {"flows"})])
def test_imports_point_down(package: str, forbidden: set[str]) -> None:
    offenders = {path: sorted(names & forbidden) for path, names in imported_roots(package).items()
                 if names & forbidden}
    assert not offenders, f"{package}/ must not import {sorted(forbidden)}: {offenders}"
