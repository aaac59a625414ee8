"""The code version recorded in lineage and compared across nodes: package version + source digest."""

from __future__ import annotations

import functools
from pathlib import Path

import blake3

__version__ = "0.1.0"
PACKAGES = ("config", "trainer", "tasks", "flows")


@functools.cache
def code_version() -> str:
    """`0.1.0+<12 hex>`: the digest covers every .py/.json/.yaml file of the project's packages."""
    root = Path(__file__).resolve().parent.parent
    h = blake3.blake3()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*")):
            if path.suffix in (".py", ".json", ".yaml") and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{__version__}+{h.hexdigest()[:12]}"
