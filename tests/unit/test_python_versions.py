"""The pinned dependencies install on CPython 3.12 and 3.13 on this platform, though the suite runs on 3.11
(`requires-python` admits 3.11 to 3.13; docs/development.md, "Python versions").

Two checks. Without the network (default run): the project's own dependencies and extras are all pinned in
constraints.txt, and so is every dependency of theirs, down the whole tree, that applies on 3.11, 3.12 or 3.13 here; so
the pins are the whole closure, and checking each pin alone (`--no-deps`) checks every version that would be installed.
With the package index (marker `pythons`, in `make test-suites`): pip, asked with `--python-version 3.12` and `3.13` at
once (two processes), must find for each pin a distribution it would install there (`--dry-run --ignore-installed
--no-deps --only-binary=:all:`, its choices read from `--report`). Only the pins whose installed wheel would not
install there as it is go to pip (those built for CPython 3.11, about 45): a pure-Python (`py3-none-any`), abi3 or
any-Python wheel for this platform installs on 3.12 and 3.13 where its Requires-Python admits them, which the installed
metadata says without the index (rouge-score, an sdist only, is among them: its wheel built here is pure Python, so its
sdist builds anywhere). DeepSpeed ships only an sdist, which tools/install.sh builds against the pinned torch with the
machine's C++ compiler on any of them: pip must list the pinned release for each Python (`pip index versions`), so
that it exists and its Requires-Python admits it. And torch, which on 3.12 and 3.13 is PyPI's build (exact pins of its
own: the CUDA libraries, triton 3.7.1), must resolve with its dependencies against that Python's pins; constraints.txt
pins triton per Python (3.9.0 on 3.11, where torch is the CPU build), so the pins are read per Python.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging import tags as packaging_tags
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYTHONS = ("3.12", "3.13")
CHECKED = ("3.11", *PYTHONS)
# Pins that ship only an sdist and are not pure Python (tools/install.sh builds it): pip must list the pinned release.
SDIST_ONLY = ("deepspeed",)


def pins(python: str | None = None) -> dict[str, str]:
    """constraints.txt's pins for CPython `python` (X.Y; the running one by default): canonical name -> version. A pin
    with a marker counts where it holds (triton: 3.9.0 on 3.11, PyPI's torch's exact 3.7.1 on 3.12 and 3.13)."""
    python = python or platform.python_version().rsplit(".", 1)[0]
    where = {"python_version": python, "python_full_version": full_version(python)}
    found: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            (specifier,) = requirement.specifier
            assert specifier.operator == "==", f"constraints.txt: {line} is not an exact pin (name==version)"
            if requirement.marker is None or requirement.marker.evaluate(where):
                name = canonicalize_name(requirement.name)
                assert name not in found, f"constraints.txt pins {name} twice for Python {python}"
                found[name] = specifier.version
    return found


def project_requirements() -> list[Requirement]:
    """pyproject.toml's dependencies and every extra's, the project's own extras left out."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return [r for r in map(Requirement, listed) if canonicalize_name(r.name) != "tandem"]


def full_version(version: str) -> str:
    """The release a marker is evaluated for: the running 3.11's own (redis wants async-timeout before 3.11.3), X.Y.0
    for the others."""
    return platform.python_version() if version == platform.python_version().rsplit(".", 1)[0] else f"{version}.0"


def applies(requirement: Requirement, extras: set[str]) -> bool:
    """Whether a dependency is installed on 3.11, 3.12 or 3.13 on this platform, with the extras asked for."""
    if requirement.marker is None:
        return True
    return any(
        requirement.marker.evaluate({"python_version": v, "python_full_version": full_version(v), "extra": extra})
        for v in CHECKED
        for extra in extras | {""}
    )


def closure() -> dict[str, set[str]]:
    """Every distribution the project installs on 3.11-3.13 here, with the extras asked of it, read from the installed
    metadata (a dependency not installed here, one of 3.12+ only, is listed without its own dependencies)."""
    wanted: dict[str, set[str]] = {}
    queue = [(r, set(r.extras)) for r in project_requirements()]
    while queue:
        requirement, extras = queue.pop()
        name = canonicalize_name(requirement.name)
        if name in wanted and extras <= wanted[name]:
            continue
        wanted[name] = wanted.get(name, set()) | extras
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        queue += [(r, set(r.extras)) for r in map(Requirement, requires) if applies(r, wanted[name])]
    return wanted


def installed(name: str) -> str | None:
    """The installed version of a distribution, None when it is not installed (a dependency of 3.12+ only)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def installs_as_is(name: str, python: str) -> bool:
    """Whether the wheel installed here would install on that CPython on this platform too (a pure-Python wheel, an
    abi3 one, one for any Python on this platform) and its Requires-Python admits it: then that CPython gets the same
    file, and the index has nothing to add. False for a wheel built for CPython 3.11 and for what is not installed."""
    if installed(name) is None:
        return False
    dist = metadata.distribution(name)
    major, minor = map(int, python.split("."))
    supported = {*packaging_tags.cpython_tags((major, minor)), *packaging_tags.compatible_tags((major, minor))}
    lines = (dist.read_text("WHEEL") or "").splitlines()
    built = {tag for line in lines if line.startswith("Tag:") for tag in packaging_tags.parse_tag(line[4:].strip())}
    # .get: a wheel without Requires-Python admits any Python, and importlib_metadata's message (what a distribution
    # found through its finder returns) raises KeyError on a missing key where the standard library's gives None.
    admits = SpecifierSet(dist.metadata.get("Requires-Python") or "").contains(f"{python}.0")
    return bool(built & supported) and admits  # one of a wheel's tags (py2.py3-none-any: two) is enough


def test_the_pins_are_the_whole_closure() -> None:
    """Every dependency the project's requirements pull in on 3.11-3.13 is pinned, and the environment has the pins."""
    pinned = pins()
    wanted = closure()
    unpinned = sorted(set(wanted) - {name for version in CHECKED for name in pins(version)})
    assert not unpinned, (
        f"installed by the project on Python {'/'.join(CHECKED)} but not pinned in constraints.txt: {unpinned}; pin "
        "each as name==version (what `pip install --dry-run --report` chooses with -c constraints.txt on that Python)"
    )
    stale = {
        name: (pinned[name], version)
        for name in wanted
        if name in pinned
        and (version := installed(name)) is not None
        and not SpecifierSet(f"=={pinned[name]}").contains(version)
    }
    assert not stale, f"the environment differs from constraints.txt (pin, installed): {stale}; run `make setup-dev`"


def test_requires_python_admits_the_checked_versions() -> None:
    requires = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    assert all(f"{version}.0" in requires for version in CHECKED), f"requires-python {requires} leaves one out"
    assert Marker("python_version >= '3.11'").evaluate()  # the suite itself runs on one of them


def refusal(python: str, stderr: str, pinned: dict[str, str]) -> str:
    """One line naming the pin pip found nothing for, the Python, and what to do."""
    match = re.search(r"(?:No matching distribution found for|satisfies the requirement) ([A-Za-z0-9._-]+)", stderr)
    name = canonicalize_name(match.group(1)) if match else "?"
    lines = stderr.strip().splitlines() or ["no error"]
    said = next((line for line in reversed(lines) if line.startswith("ERROR")), lines[-1])
    return (
        f"{name}=={pinned.get(name, '?')}: pip finds no distribution for CPython {python} on {platform.machine()} "
        f"Linux ({said}); move its pin in constraints.txt to a release with a cp{python.replace('.', '')} (or abi3, or "
        "pure-Python) wheel, or narrow requires-python in pyproject.toml"
    )


def pip(*args: str) -> subprocess.Popen[str]:
    """pip of this environment, reading the index its configuration names, in the background."""
    command = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.pythons
def test_every_pin_installs_on_python_3_12_and_3_13(tmp_path: Path) -> None:
    """pip's answer for each pin whose installed wheel is CPython 3.11's (about 45, the rest install as they are), on
    both Pythons at once; DeepSpeed's sdist by the versions pip lists for each Python. About 40 s on this 2-core
    machine, mostly pip reading every release's files on the index pages."""
    pinned = {python: pins(python) for python in PYTHONS}
    asked = {
        python: {
            name: v for name, v in pinned[python].items() if name not in SDIST_ONLY and not installs_as_is(name, python)
        }
        for python in PYTHONS
    }
    runs, sdist_runs = {}, {}
    for python, wanted in asked.items():
        (tmp_path / f"{python}.txt").write_text("".join(f"{name}=={version}\n" for name, version in wanted.items()))
        runs[python] = pip(
            "install",
            "--dry-run",
            "--quiet",
            "--ignore-installed",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            python,
            "--report",
            str(tmp_path / f"{python}.json"),
            "-r",
            str(tmp_path / f"{python}.txt"),
        )
        sdist_runs[python] = {name: pip("index", "versions", name, "--python-version", python) for name in SDIST_ONLY}
    for python, run in runs.items():
        _, stderr = run.communicate(timeout=600)
        assert run.returncode == 0, refusal(python, stderr, pinned[python])
        report = json.loads((tmp_path / f"{python}.json").read_text())["install"]
        chosen = {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"] for item in report}
        other = {name: version for name, version in chosen.items() if Version(version) != Version(asked[python][name])}
        assert chosen.keys() == asked[python].keys() and not other, f"CPython {python}: pip chose {other or chosen}"
        for name, sdist_run in sdist_runs[python].items():
            listed, stderr = sdist_run.communicate(timeout=600)
            version = pinned[python][name]
            assert f" {version}," in listed or f" {version}\n" in listed, (
                f"{name}=={version}: pip lists no such release for CPython {python} ({stderr.strip()[-200:]}); "
                "move its pin in constraints.txt to a release whose Requires-Python admits it"
            )


@pytest.mark.pythons
def test_pypis_torch_resolves_against_the_pins_on_python_3_12_and_3_13(tmp_path: Path) -> None:
    """On 3.12 and 3.13 torch is PyPI's build (the CPU wheel here is 3.11's), which pins its own CUDA libraries and
    triton exactly: pip, resolving torch with its dependencies against that Python's pins, must find no conflict (a
    triton pin of 3.9.0 made it refuse torch 2.13.0, which requires 3.7.1) and choose every pin as pinned, with nothing
    unpinned. The per-pin check above cannot see this: it asks for each pin alone. The pins go in as a file of that
    Python's own (pip evaluates a constraint's marker for the Python it runs on, not for --python-version)."""
    runs = {}
    for python in PYTHONS:
        pinned = pins(python)
        (tmp_path / f"c-{python}.txt").write_text("".join(f"{name}=={v}\n" for name, v in pinned.items()))
        runs[python] = pip(
            "install",
            "--dry-run",  # not --quiet: pip then says which requirements conflict
            "--ignore-installed",
            "--only-binary=:all:",
            "--python-version",
            python,
            "--report",
            str(tmp_path / f"torch-{python}.json"),
            "-c",
            str(tmp_path / f"c-{python}.txt"),
            f"torch=={pinned['torch']}",
        )
    for python, run in runs.items():
        stdout, stderr = run.communicate(timeout=600)
        why = [line.strip() for line in (stdout + stderr).splitlines() if " depends on " in line or "requested" in line]
        assert run.returncode == 0, f"CPython {python}: pip refuses torch against the pins: {why or stderr[-800:]}"
        report = json.loads((tmp_path / f"torch-{python}.json").read_text())["install"]
        chosen = {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"] for item in report}
        pinned = pins(python)
        unpinned = sorted(set(chosen) - set(pinned))
        assert not unpinned, f"CPython {python}: torch's dependencies not pinned in constraints.txt: {unpinned}"
        other = {n: v for n, v in chosen.items() if Version(v) != Version(pinned[n])}
        assert not other, f"CPython {python}: pip chose {other} against the pins"
