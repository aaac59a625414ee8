"""The model registry on storage: registry/{model}/v{n:04d}.json, versions claimed atomically.

Plain functions (used by the register task and, later, the registry CLI). A version is claimed by
creating its file exclusively: two registrations racing get two versions, and no entry is ever
overwritten.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from config import layout
from config.storage import create_exclusive, join, listdir

VERSION_FILE = re.compile(r"^v(\d{4,})\.json$")
MAX_CLAIM_ATTEMPTS = 100


def versions(storage: str, model: str) -> list[int]:
    """Registered version numbers of a model, ascending."""
    found = (VERSION_FILE.match(name) for name in listdir(layout.registry_dir(storage, model)))
    return sorted(int(m.group(1)) for m in found if m)


def register_version(storage: str, model: str, entry: dict[str, Any]) -> tuple[int, str]:
    """Write `entry` as the next free version; returns (version, URL)."""
    version = (versions(storage, model) or [0])[-1] + 1
    for _ in range(MAX_CLAIM_ATTEMPTS):
        url = join(layout.registry_dir(storage, model), layout.registry_entry_name(version))
        doc = {
            "schema": layout.REGISTRY_SCHEMA,
            "model": model,
            "version": version,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            **entry,
        }
        if create_exclusive(url, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()):
            return version, url
        version += 1  # somebody else claimed it first: take the next one
    raise RuntimeError(f"could not claim a version of {model} after {MAX_CLAIM_ATTEMPTS} attempts")
