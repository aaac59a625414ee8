"""The checkout this code runs from: its root directory, and its version (recorded in lineage, compared across
nodes by preflight): the package version plus a digest of every source file of the project's packages."""

from __future__ import annotations

import functools
from pathlib import Path

import blake3

__version__ = "0.1.0"
PROJECT_ROOT = Path(__file__).resolve().parent.parent
# Every package of the project (pyproject.toml's `packages.find.include`; tests/unit/test_layout.py keeps the two
# equal): a change in any of them is another code version.
PACKAGES = ("core", "config", "storage", "staging", "tracking", "pipeline", "launch", "trainer", "tasks", "flows")


@functools.cache
def code_version() -> str:
    """`0.1.0+<12 hex>`: the digest covers every .py/.json/.yaml/.jinja file of the project's packages."""
    h = blake3.blake3()
    for package in PACKAGES:
        for path in sorted((PROJECT_ROOT / package).rglob("*")):
            if path.suffix in (".py", ".json", ".yaml", ".jinja") and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(PROJECT_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{__version__}+{h.hexdigest()[:12]}"
