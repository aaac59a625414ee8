"""The package layout of docs/architecture.md, held against the code: which package may import which (whole
directories, no special cases), what only some packages may import (Prefect, torch, fsspec), no import cycle anywhere
in the production code (imports inside functions included), no alias re-exports, no private helper imported from
another module, no function over 50 lines, and no module over 400 (but those still to be split)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.checkout import PACKAGES

ROOT = Path(__file__).resolve().parents[2]
# Each package and the packages of ours it may import: arrows point down this table only.
ALLOWED = {
    "core": set(),
    "config": {"core"},
    "storage": {"core", "config"},
    "staging": {"core", "config", "storage"},
    "tracking": {"core", "config", "storage"},
    "pipeline": {"core", "config", "storage"},
    "launch": {"core", "config", "storage"},
    "trainer": {"core", "config", "storage"},
    "tasks": {"core", "config", "storage", "staging", "tracking", "pipeline", "launch"},
    "flows": {"core", "config", "storage", "staging", "tracking", "pipeline", "launch", "tasks"},
}
# Third-party packages only some of ours may import: Prefect above the libraries (and the prefect launch backend),
# torch and DeepSpeed on the ranks (and MLflow's model flavour, which loads a model), fsspec below config.
THIRD_PARTY = {
    "prefect": {"tasks", "flows", "launch/backends/prefect.py", "launch/api_outage.py"},
    "torch": {"trainer", "tracking/mlflow_model.py"},
    "deepspeed": {"trainer"},
    "fsspec": {"storage", "staging", "tracking", "pipeline", "launch", "trainer", "tasks", "flows"},
}
MAX_FUNCTION_LINES = 50
MAX_MODULE_LINES = 400
# A function of the trainer takes values, not long lists of loose ones (self and cls not counted).
MAX_TRAINER_PARAMETERS = 7


def sources() -> Iterator[tuple[str, Path]]:
    """(package, file) of every production module."""
    for package in ALLOWED:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield package, path


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> Iterator[tuple[str, list[str]]]:
    """(module, names) of every absolute import in a file, wherever it stands (inside functions too)."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, [alias.name for alias in node.names]


def allowed_here(rule: set[str], path: Path) -> bool:
    relative = str(path.relative_to(ROOT))
    return any(relative == entry or relative.startswith(f"{entry}/") for entry in rule)


def test_required_top_level_exists() -> None:
    for name in (
        "pyproject.toml",
        "README.md",
        "flows",
        "tasks",
        "trainer",
        "config",
        "storage",
        "launch",
        "tests",
        "docker",
        "docs/architecture.md",
    ):
        assert (ROOT / name).exists(), name


def test_every_package_is_installed_and_versioned() -> None:
    """pyproject.toml installs every package of ALLOWED, and the code version digests every one of them."""
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {name.rstrip("*") for name in include} == set(ALLOWED) == set(PACKAGES)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_down(package: str) -> None:
    offenders = {}
    for owner, path in sources():
        if owner != package:
            continue
        ours = {module.split(".")[0] for module, _ in imports(path)} & set(ALLOWED)
        if bad := ours - ALLOWED[package] - {package}:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert not offenders, f"{package}/ may import only {sorted(ALLOWED[package])} of ours: {offenders}"


@pytest.mark.parametrize("library", sorted(THIRD_PARTY))
def test_third_party_stays_where_it_belongs(library: str) -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for _, path in sources()
        if any(module.split(".")[0] == library for module, _ in imports(path))
        and not allowed_here(THIRD_PARTY[library], path)
    ]
    assert not offenders, f"only {sorted(THIRD_PARTY[library])} may import {library}: {offenders}"


def test_tasks_are_thin() -> None:
    """tasks/ is one flat folder of Prefect task modules: each defines a task, and libraries live beside the flows."""
    assert not [p for p in (ROOT / "tasks").iterdir() if p.is_dir() and p.name != "__pycache__"]
    plain = [
        path.name
        for path in (ROOT / "tasks").glob("*.py")
        if path.name != "__init__.py" and not re.search(r"^\s*@(task|materialize)\b", path.read_text(), re.M)
    ]
    assert not plain, f"tasks/ holds only @task modules; move these to the library they belong to: {plain}"


def import_graph() -> dict[str, set[str]]:
    """Production module -> the production modules it imports (a package's import counts as its __init__)."""
    modules = {module_name(path): path for _, path in sources()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for module, names in imports(path):
            if module in modules:
                targets.add(module)
            # `from package import module` imports the submodule
            targets.update(f"{module}.{n}" for n in names if f"{module}.{n}" in modules)
        graph[name] = targets - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    """No production module reaches itself through imports, counting imports inside functions."""
    assert not cycles(import_graph())


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def defined_names(path: Path) -> set[str]:
    """Names a module defines at its top level (functions, classes, assignments), not those it imports."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                elements = target.elts if isinstance(target, ast.Tuple) else [target]
                names.update(e.id for e in elements if isinstance(e, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_names_are_imported_from_where_they_are_defined() -> None:
    """No alias re-exports (a name is imported from the module that defines it) and no private helper (`_name`) is
    imported from another module."""
    modules = {module_name(path): path for _, path in sources()}
    offenders = []
    for _, path in sources():
        for module, names in imports(path):
            if module not in modules:
                continue
            defined = defined_names(modules[module])
            for name in names:
                if f"{module}.{name}" in modules:
                    continue  # a submodule
                if name not in defined:
                    offenders.append(f"{path.relative_to(ROOT)}: {name} is not defined in {module}")
                elif name.startswith("_"):
                    offenders.append(f"{path.relative_to(ROOT)}: imports the private {module}.{name}")
    assert not offenders, offenders


def test_functions_are_short() -> None:
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for _, path in sources()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's parameters, every kind counted (*args and **kwargs one each), self and cls not."""
    args = node.args
    names = [a.arg for a in [*args.posonlyargs, *args.args]]
    count = len(names) + len(args.kwonlyargs) + (args.vararg is not None) + (args.kwarg is not None)
    return count - (1 if names and names[0] in ("self", "cls") else 0)


def test_trainer_functions_take_values_not_long_parameter_lists() -> None:
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({parameter_count(node)} parameters)"
        for package, path in sources()
        if package == "trainer"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and parameter_count(node) > MAX_TRAINER_PARAMETERS
    ]
    assert not long, f"trainer functions over {MAX_TRAINER_PARAMETERS} parameters: make a value of them: {long}"


def test_the_parameter_count_counts_every_kind() -> None:
    (node,) = ast.parse("def f(self, a, /, b, *c, d, **e): pass").body
    assert isinstance(node, ast.FunctionDef) and parameter_count(node) == 5


def test_the_trainer_reads_the_test_faults_in_one_place() -> None:
    """Fault injection is a value read once at a rank's start (trainer/watch/faults.py), never an environment variable
    read where training runs."""
    readers = [
        str(path.relative_to(ROOT))
        for package, path in sources()
        if package == "trainer" and "TANDEM_TEST_" in path.read_text() and path != ROOT / "trainer/watch/faults.py"
    ]
    assert not readers, f"only trainer/watch/faults.py may name a TANDEM_TEST_ variable: {readers}"


def test_modules_are_small() -> None:
    lines = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for _, path in sources()}
    long = sorted(f"{name} ({count})" for name, count in lines.items() if count > MAX_MODULE_LINES)
    assert not long, f"modules over {MAX_MODULE_LINES} lines: split them: {long}"


def test_the_trainer_and_the_gpu_benchmark_import_without_prefect() -> None:
    """A GPU machine without Prefect runs the trainer and tests/benchmarks/bench_gpu.py from a checkout
    (tests/benchmarks/GPU.md): their modules import with Prefect made unimportable, in a fresh interpreter."""
    code = """
import importlib, sys
class NoPrefect:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "prefect":
            raise ImportError("Prefect is not installed on this machine")
sys.meta_path.insert(0, NoPrefect())
for module in ("trainer.__main__", "trainer.loop", "trainer.build", "trainer.evaluate", "trainer.evaluation.stage",
               "trainer.evaluation.samples", "trainer.model.tiny", "tests.benchmarks.bench_gpu",
               "tests.benchmarks.bench_train", "staging.stage", "pipeline.plan", "pipeline.models", "config.loader"):
    importlib.import_module(module)
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


# Modules without logic of their own to test: declarations, or a thin wiring of functions tested in their own modules.
NO_LOGIC = {
    "core/errors.py": "error types and their exit codes, declared (every test of an exit code uses them)",
    "trainer/__main__.py": "the rank's entry point: parses --spec and hands trainer.loop to trainer/harness.py",
    "trainer/logging_setup.py": "one logging.basicConfig with core/rank_log.py's format",
    "tasks/evaluate.py": "a Prefect task: launch/phase.py's eval phase, then eval.json read back and logged",
    "tasks/loss_curve.py": "a Prefect task: pipeline/loss_curve.py's plot, logged",
}


def unit_test_of(path: Path) -> Path:
    """Where a production module's unit tests live: tests/unit/<its folder>/test_<its name>.py (a package's
    __init__.py: test_init.py)."""
    relative = path.relative_to(ROOT)
    name = "init" if relative.stem == "__init__" else relative.stem
    return ROOT / "tests" / "unit" / relative.parent / f"test_{name}.py"


def needs_a_test(path: Path) -> bool:
    """Every module but a package's __init__.py that defines nothing (a docstring, a constant or two)."""
    tree = ast.parse(path.read_text())
    return path.name != "__init__.py" or any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) for node in tree.body
    )


def test_every_module_with_logic_has_a_test_module_of_its_name() -> None:
    """STYLE.md's convention 13: the test for a file is found by its name."""
    missing = [
        f"{path.relative_to(ROOT)}: {unit_test_of(path).relative_to(ROOT)}"
        for _, path in sources()
        if needs_a_test(path) and not unit_test_of(path).exists() and str(path.relative_to(ROOT)) not in NO_LOGIC
    ]
    assert not missing, f"modules without their test module: {missing}"


def test_the_list_of_modules_without_logic_is_current() -> None:
    """Each entry names a module that exists and has no test module of its name: a module that gains one leaves the
    list."""
    modules = {str(path.relative_to(ROOT)): path for _, path in sources()}
    for name in NO_LOGIC:
        assert name in modules, f"{name} is no module any more: remove it from the list"
        test = unit_test_of(modules[name])
        assert not test.exists(), f"{name} has {test.relative_to(ROOT)}: remove it from the list"


def test_every_unit_test_module_is_named_after_a_module() -> None:
    """Under tests/unit/<package>/, test_<name>.py tests <package>/.../<name>.py (a renamed or removed module takes its
    test module with it); tests/unit/ itself holds the checks of the whole repository (docs, layout, docker)."""
    expected = {unit_test_of(path) for _, path in sources()}
    stray = [
        str(path.relative_to(ROOT))
        for package in ALLOWED
        for path in sorted((ROOT / "tests" / "unit" / package).rglob("test_*.py"))
        if path not in expected
    ]
    assert not stray, f"test modules named after no module: {stray}"


def test_every_test_folder_is_a_package() -> None:
    """Test modules of one name in two folders (tests/unit/storage/test_registry.py, tests/unit/flows/test_registry.py)
    import as two modules only when every folder on their way is a package."""
    folders = {path.parent for path in (ROOT / "tests").rglob("test_*.py")} - {ROOT / "tests" / "fixtures"}
    lacking = sorted(
        str(folder.relative_to(ROOT))
        for folder in folders
        if "fixtures" not in folder.relative_to(ROOT).parts
        for parent in [folder, *folder.relative_to(ROOT).parents][:-1]
        if not (ROOT / parent / "__init__.py").exists()
    )
    assert not lacking, f"folders without __init__.py: {lacking}"
