"""The model registry on any fsspec storage (docs/architecture.md): registry/{model}/v{n:04d}.json + champion.json.

Plain functions, free of Prefect (the registry CLI uses them without a server). A version is claimed
by creating its file exclusively (link() locally, a conditional PUT on S3): two registrations racing
get two versions and no entry is ever overwritten. The `champion` alias is a separate small document
swapped atomically (compare-and-swap on its previous content), naming the best version so far.

Every document carries `digest`: the SHA-256 of its canonical bytes without that field, and readers
accept only the exact canonical bytes with a matching digest. A flipped byte that still parses as JSON
(a digit of a metric, a letter of a URL) would otherwise be served as truth for as long as the registry
lives; now it is refused, naming the file.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from core.errors import UserError
from core.redact import redact
from storage import layout
from storage.conditional import create_exclusive, read_versioned, replace_if_unchanged
from storage.digest import digest_bytes
from storage.fs import exists, listdir, read_bytes, write_bytes_atomic
from storage.location import Location, join
from storage.metrics import metric_value

VERSION_FILE = re.compile(r"^v(\d{4,})\.json$")
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
MAX_CLAIM_ATTEMPTS = 1000
MAX_SWAP_ATTEMPTS = 100


DIGEST_KEY = "digest"
DIGEST_ALGORITHM = "sha256"


def dumps(doc: dict[str, Any]) -> bytes:
    """The canonical bytes of a registry document."""
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def sealed(doc: dict[str, Any]) -> bytes:
    """The bytes every registry document is stored as: canonical, with the digest of its body inside."""
    body = {key: value for key, value in doc.items() if key != DIGEST_KEY}
    return dumps({**body, DIGEST_KEY: digest_bytes(dumps(body), DIGEST_ALGORITHM)})


def unseal(url: Location, raw: bytes) -> dict[str, Any]:
    """The document stored at `url` as `raw`, refused unless it is exactly what `sealed` wrote."""
    fix = "the registry file is corrupt or was edited by hand; restore it from a backup (versions are never rewritten)"
    try:
        doc = json.loads(raw)
    except ValueError as exc:  # UnicodeDecodeError is a ValueError too
        raise UserError(f"{url}: not valid JSON ({exc}); {fix}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get(DIGEST_KEY), str):
        raise UserError(f"{url}: no {DIGEST_KEY!r} field; {fix}")
    body = {key: value for key, value in doc.items() if key != DIGEST_KEY}
    actual = digest_bytes(dumps(body), DIGEST_ALGORITHM)
    if actual != doc[DIGEST_KEY] or sealed(body) != raw:
        raise UserError(
            f"{url}: {DIGEST_ALGORITHM} digest mismatch: recorded {doc[DIGEST_KEY]}, content gives {actual}; {fix}"
        )
    return doc


def models(storage: Location) -> list[str]:
    """Names of the models that have at least one version."""
    return [
        name for name in listdir(layout.registry_root(storage)) if MODEL_NAME.match(name) and versions(storage, name)
    ]


def versions(storage: Location, model: str) -> list[int]:
    """Registered version numbers of a model, ascending."""
    found = (VERSION_FILE.match(name) for name in listdir(layout.registry_dir(storage, model)))
    return sorted(int(m.group(1)) for m in found if m)


def entry_url(storage: Location, model: str, version: int) -> Location:
    """URL of one version's document."""
    return join(layout.registry_dir(storage, model), layout.registry_entry_name(version))


def read_entry(storage: Location, model: str, version: int) -> dict[str, Any]:
    """One registered version, checked for its schema."""
    url = entry_url(storage, model, version)
    try:
        raw = read_bytes(url)
    except FileNotFoundError:
        known = ", ".join(f"v{v:04d}" for v in versions(storage, model)) or "none"
        raise UserError(f"{model}:v{version:04d} is not registered under {storage} (versions: {known})") from None
    doc = unseal(url, raw)
    if doc.get("schema") != layout.REGISTRY_SCHEMA:
        raise UserError(f"{url}: schema {doc.get('schema')!r} is not {layout.REGISTRY_SCHEMA!r}")
    return doc


def register_version(storage: Location, model: str, entry: dict[str, Any]) -> tuple[int, Location]:
    """Write `entry` as the next free version (secret-looking values masked: a registry entry is kept forever and
    read by everyone who can read the registry); returns (version, URL)."""
    entry = redact(entry)
    version = (versions(storage, model) or [0])[-1] + 1
    for _ in range(MAX_CLAIM_ATTEMPTS):
        url = entry_url(storage, model, version)
        doc = {
            "schema": layout.REGISTRY_SCHEMA,
            "model": model,
            "version": version,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            **entry,
        }
        if create_exclusive(url, sealed(doc)):
            return version, url
        version += 1  # somebody else claimed it first: take the next one
    raise RuntimeError(f"could not claim a version of {model} after {MAX_CLAIM_ATTEMPTS} attempts")


def champion(storage: Location, model: str) -> dict[str, Any] | None:
    """The champion alias ({"version", "metric", "direction", "value", ...}), or None."""
    url = layout.champion_url(storage, model)
    data, _ = read_versioned(url)
    return unseal(url, data) if data is not None else None


def better(value: float, than: float, direction: str) -> bool:
    """Strictly better in the metric's direction."""
    return value < than if direction == "min" else value > than


def promote(storage: Location, model: str, version: int, metrics: dict[str, Any], metric: str, direction: str) -> bool:
    """Make `version` the champion if it beats the current one on `metric`; True when it did.

    Compare-and-swap: re-read and retry when another registration changed the alias in between.
    """
    url = layout.champion_url(storage, model)
    doc = {
        "schema": layout.CHAMPION_SCHEMA,
        "model": model,
        "version": version,
        "metric": metric,
        "direction": direction,
        "value": metric_value(metrics, metric),
        "updated_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    for _ in range(MAX_SWAP_ATTEMPTS):
        data, token = read_versioned(url)
        if data is not None:
            current = unseal(url, data)
            if current["version"] == version:
                return True
            # Compare on this run's metric, read from the champion's own entry (it may have been
            # promoted under another metric).
            theirs = metric_value(read_entry(storage, model, current["version"])["metrics"], metric)
            ours = metric_value(metrics, metric)
            if theirs is not None and (ours is None or not better(ours, theirs, direction)):
                return False
        if replace_if_unchanged(url, sealed(doc), token):
            return True
    raise RuntimeError(f"could not update {url} after {MAX_SWAP_ATTEMPTS} attempts")


def resolve(storage: Location, ref: str) -> dict[str, Any]:
    """The entry named by `MODEL`, `MODEL:VERSION` (3, v3, v0003) or `MODEL:champion`; MODEL alone: newest."""
    model, _, which = ref.partition(":")
    if not MODEL_NAME.match(model):
        raise UserError(f"{ref}: expected MODEL[:VERSION|:champion], e.g. tandem-tiny:v0001")
    if not exists(layout.registry_dir(storage, model)) or not versions(storage, model):
        known = ", ".join(models(storage)) or "none"
        raise UserError(f"{model}: no such model in {layout.registry_root(storage)} (models: {known})")
    if which == "champion":
        alias = champion(storage, model)
        if alias is None:
            raise UserError(f"{model} has no champion yet; name a version, e.g. {model}:v0001")
        return read_entry(storage, model, alias["version"])
    if not which:
        return read_entry(storage, model, versions(storage, model)[-1])
    digits = which.lower().removeprefix("v")
    if not digits.isdigit():
        raise UserError(f"{ref}: the version must be a number (v0003 or 3) or 'champion'")
    return read_entry(storage, model, int(digits))


def read_mirror(storage: Location, model: str, version: int) -> dict[str, Any] | None:
    """How a version is mirrored in MLflow ({"status": "pending"|"done", "tracking_uri", "mlflow_version", ...}), or
    None when it never was. The entry itself is never rewritten; this record beside it changes as the mirror does."""
    url = layout.mirror_url(storage, model, version)
    return unseal(url, read_bytes(url)) if exists(url) else None


def write_mirror(storage: Location, model: str, version: int, status: str, tracking_uri: str, **details: Any) -> None:
    """Record the state of a version's MLflow mirror (replaced whole: a later sync completes a pending one)."""
    doc = {
        "schema": layout.MIRROR_SCHEMA,
        "model": model,
        "version": version,
        "status": status,
        "tracking_uri": tracking_uri,
        "updated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        **details,
    }
    write_bytes_atomic(layout.mirror_url(storage, model, version), sealed(redact(doc)))
