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


def test_the_trainer_and_the_gpu_benchmark_import_without_prefect() -> None:
    """A GPU machine without Prefect runs the trainer and tests/benchmarks/bench_gpu.py from a checkout
    (tests/benchmarks/GPU.md): their modules import with Prefect made unimportable, in a fresh interpreter."""
    import subprocess
    import sys

    code = """
import importlib, sys
class NoPrefect:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "prefect":
            raise ImportError("Prefect is not installed on this machine")
sys.meta_path.insert(0, NoPrefect())
for module in ("trainer.__main__", "trainer.loop", "trainer.evaluate", "trainer.samples", "trainer.tiny",
               "tests.benchmarks.bench_gpu", "tests.benchmarks.bench_train", "tasks.data.stage", "config.loader"):
    importlib.import_module(module)
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
