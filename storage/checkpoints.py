"""Checkpoint and export directories on storage: the writer of their manifest and COMPLETE marker, the reader
that decides which exist (only those whose COMPLETE matches their manifest), deletion and retention.

Shared by the trainer (save, resume, retention, export) and the flow (wait, evaluate, register), so both sides
apply the same rule (docs/architecture.md: "a directory without COMPLETE does not exist for readers").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.errors import UserError
from storage import layout
from storage.digest import digest_bytes
from storage.fs import exists, listdir, read_bytes, remove, write_bytes_atomic, write_json_atomic
from storage.location import Location, join
from storage.manifest import read_manifest, verify_files

log = logging.getLogger(__name__)

STEP_PREFIX = "step-"


@dataclass(frozen=True)
class CompleteCheckpoint:
    """A checkpoint whose COMPLETE marker matches its manifest."""

    url: Location
    step: int
    manifest_digest: str
    manifest: dict[str, Any]


def step_of(name: str) -> int | None:
    """The step number of a `step-00000100` directory name, else None."""
    digits = name.removeprefix(STEP_PREFIX)
    return int(digits) if name.startswith(STEP_PREFIX) and digits.isdigit() else None


def inspect(url: Location, schema: str = layout.CHECKPOINT_SCHEMA) -> CompleteCheckpoint | str:
    """The checkpoint at `url` if its COMPLETE matches its manifest and every file has its size; otherwise
    why not, in one line naming the file. `schema`: the manifest's (a universal form's has its own)."""
    complete, manifest_url = join(url, layout.COMPLETE), join(url, layout.MANIFEST)
    if not exists(complete):
        return f"{complete}: missing (the save did not finish)"
    try:
        manifest, digest = read_manifest(url, schema)
        recorded = read_bytes(complete).decode(errors="replace").strip()
        if recorded != digest:
            return (
                f"{manifest_url}: digest {digest} is not the {recorded!r} that {complete} records; the "
                "manifest or its marker changed after the save"
            )
        verify_files(url, manifest, mode="size")
        return CompleteCheckpoint(url, int(manifest["step"]), digest, manifest)
    except UserError as exc:
        return str(exc)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # bytes that are not our JSON any more
        return f"{manifest_url}: unreadable ({type(exc).__name__}: {exc})"


def read_complete(url: Location) -> CompleteCheckpoint | None:
    """The checkpoint at `url` if its COMPLETE matches its manifest and every file has its size."""
    found = inspect(url)
    return found if isinstance(found, CompleteCheckpoint) else None


def step_dirs(run_url: Location) -> list[tuple[int, Location]]:
    """(step, URL) of every step directory of a run, complete or not, newest first."""
    root = layout.checkpoints_dir(run_url)
    found = [(step, join(root, name)) for name in listdir(root) if (step := step_of(name)) is not None]
    return sorted(found, reverse=True)


def complete_checkpoints(run_url: Location) -> list[CompleteCheckpoint]:
    """Every complete checkpoint of a run, newest first."""
    return [ckpt for _, url in step_dirs(run_url) if (ckpt := read_complete(url)) is not None]


def latest_complete(run_url: Location) -> CompleteCheckpoint | None:
    """The newest complete checkpoint of a run, or None."""
    for _, url in step_dirs(run_url):
        ckpt = read_complete(url)
        if ckpt is not None:
            return ckpt
    return None


def commit(
    url: Location, manifest: dict[str, Any], *, verify: bool = False, before_seal: Callable[[], None] | None = None
) -> str:
    """Write manifest.json, then (optionally after checking every listed file's size) COMPLETE with the
    manifest's digest in the manifest's own digest algorithm: the commit of a checkpoint or export directory.
    `before_seal` runs just before COMPLETE is written (fault injection). Returns that digest."""
    raw = write_json_atomic(join(url, layout.MANIFEST), manifest)
    if verify:
        verify_files(url, manifest, mode="size")
    if before_seal is not None:
        before_seal()
    return seal(url, raw, manifest["digest_algorithm"])


def seal(url: Location, manifest_bytes: bytes, algorithm: str) -> str:
    """Write COMPLETE holding the digest of the manifest's bytes; returns it."""
    digest = digest_bytes(manifest_bytes, algorithm)
    write_bytes_atomic(join(url, layout.COMPLETE), (digest + "\n").encode())
    return digest


def checkpoint_manifest(
    step: int, world_size: int, meta: dict[str, Any], algorithm: str, files: list[dict[str, Any]]
) -> dict[str, Any]:
    """A tandem.checkpoint/1 document (meta: zero_stage, method and sequence_parallel_size)."""
    return {
        "schema": layout.CHECKPOINT_SCHEMA,
        **meta,
        "step": step,
        "world_size": world_size,
        "digest_algorithm": algorithm,
        "files": files,
    }


def model_manifest(step: int, algorithm: str, files: list[dict[str, Any]]) -> dict[str, Any]:
    """A tandem.model/1 document: the files of an exported model, by path."""
    return {
        "schema": layout.MODEL_SCHEMA,
        "step": step,
        "digest_algorithm": algorithm,
        "files": sorted(files, key=lambda f: f["path"]),
    }


def universal_manifest(source: CompleteCheckpoint, algorithm: str, files: list[dict[str, Any]]) -> dict[str, Any]:
    """A tandem.universal/1 document: the files of a checkpoint's universal form and the checkpoint it came from
    (its step, world size, ZeRO stage, method and manifest digest)."""
    return {
        "schema": layout.UNIVERSAL_SCHEMA,
        "step": source.step,
        "source_world_size": source.manifest["world_size"],
        "source_manifest_digest": source.manifest_digest,
        "zero_stage": source.manifest["zero_stage"],
        "method": source.manifest["method"],
        "digest_algorithm": algorithm,
        "files": sorted(files, key=lambda f: f["path"]),
    }


def read_universal(source: CompleteCheckpoint) -> CompleteCheckpoint | None:
    """The complete universal form of `source` (its COMPLETE matches its manifest, every file has its size, and it
    was converted from exactly this checkpoint), else None."""
    found = inspect(layout.universal_dir(source.url), layout.UNIVERSAL_SCHEMA)
    if isinstance(found, str) or found.manifest["source_manifest_digest"] != source.manifest_digest:
        return None
    return found


def verified_export_step(url: Location) -> int | None:
    """The step of the exported model at `url` (a run's final/) if its COMPLETE matches its manifest and every file
    its digest (a full read), else None."""
    if not exists(join(url, layout.COMPLETE)):
        return None
    try:
        manifest, digest = read_manifest(url, layout.MODEL_SCHEMA)
        if read_bytes(join(url, layout.COMPLETE)).decode(errors="replace").strip() != digest:
            return None
        verify_files(url, manifest, mode="full")
    except (UserError, OSError, ValueError):
        return None
    return int(manifest["step"])


def remove_dir(url: Location) -> None:
    """Delete a checkpoint or export directory, COMPLETE first, so a crash half way leaves an incomplete one."""
    if not exists(url):
        return
    remove(join(url, layout.COMPLETE))
    remove(url, recursive=True)


def retention_doomed(run_url: Location, keep_latest_k: int | None) -> list[int]:
    """The steps retention deletes: complete checkpoints beyond the newest k, and incomplete ones older than the
    newest complete; never the newest complete one."""
    complete = complete_checkpoints(run_url)
    if not complete:
        return []
    newest = complete[0].step
    doomed = [c.step for c in complete[keep_latest_k:]] if keep_latest_k else []
    complete_steps = {c.step for c in complete}
    doomed += [step for step, _ in step_dirs(run_url) if step < newest and step not in complete_steps]
    return sorted(doomed)


def apply_retention(run_url: Location, keep_latest_k: int | None) -> list[int]:
    """Delete what retention_doomed names; returns the deleted steps."""
    doomed = retention_doomed(run_url, keep_latest_k)
    for step in doomed:
        remove_dir(layout.checkpoint_dir(run_url, step))
    if doomed:
        log.info("retention (keep_latest_k=%s): deleted steps %s", keep_latest_k, doomed)
    return doomed
