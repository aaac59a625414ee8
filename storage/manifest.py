"""Manifests: the list of files (size, digest) that makes a directory whole, and its verification.

Used for staged datasets and checkpoints alike. `verify_files` is the one check every node runs
before its ranks read a byte (docs/architecture.md: "every node verifies the dataset manifest").
"""

from __future__ import annotations

import json
from typing import Any, Literal

from core.errors import UserError
from storage import layout
from storage.digest import digest_bytes, digest_url
from storage.fs import filesystem, find_sizes, read_bytes
from storage.location import Location, join

VerifyMode = Literal["full", "size"]


def read_manifest(base: Location, schema: str | tuple[str, ...]) -> tuple[dict[str, Any], str]:
    """(manifest, digest of its bytes) of the directory `base`; refuses a schema that is not `schema` (or one of
    them)."""
    url = join(base, layout.MANIFEST)
    try:
        raw = read_bytes(url)
    except FileNotFoundError:
        raise UserError(f"{url}: missing; the directory is incomplete (re-run the step that writes it)") from None
    doc = json.loads(raw)
    known = (schema,) if isinstance(schema, str) else schema
    if doc.get("schema") not in known:
        expected = " or ".join(repr(k) for k in known)
        raise UserError(f"{url}: schema {doc.get('schema')!r} is not {expected}; written by another Tandem version")
    return doc, digest_bytes(raw, doc["digest_algorithm"])


def verify_files(base: Location, manifest: dict[str, Any], mode: VerifyMode = "full") -> None:
    """Check every file of `manifest` under `base`: present, same size, and (full) same digest.

    `size` is the quick check (a listing); `full` re-reads every byte. Each failure is a UserError that
    names the file and what differs (expected and actual size or digest).
    """
    algorithm = manifest["digest_algorithm"]
    # One listing instead of a request per file: on an object store that is one LIST, not N HEADs.
    sizes = find_sizes(base)
    for entry in manifest["files"]:
        url = join(base, entry["path"])
        _, path = filesystem(url)
        if path not in sizes:
            raise UserError(f"{url}: missing (listed in {layout.MANIFEST}); re-stage or restore it")
        size = sizes[path]
        if size != entry["size"]:
            raise UserError(
                f"{url}: size {size} != expected {entry['size']}; the file changed after staging, re-stage it"
            )
        if mode == "full":
            actual, _ = digest_url(url, algorithm)
            if actual != entry["digest"]:
                raise UserError(
                    f"{url}: {algorithm} digest mismatch: expected {entry['digest']}, got {actual}; "
                    "the file is corrupt or was modified, re-stage it"
                )


def verify_dataset(url: Location, mode: VerifyMode = "full", manifest_digest: str | None = None) -> dict[str, Any]:
    """The check every node runs before its ranks read a byte of a staged dataset; returns its manifest.

    With `manifest_digest` (from spec.json), the manifest itself must be the one the run was planned with.
    """
    manifest, digest = read_manifest(url, layout.DATASET_SCHEMAS)
    if manifest_digest is not None and digest != manifest_digest:
        raise UserError(
            f"{join(url, layout.MANIFEST)}: digest mismatch: expected {manifest_digest}, got {digest}; "
            "the dataset was staged again after the run was planned, prepare it again"
        )
    verify_files(url, manifest, mode)
    return manifest
