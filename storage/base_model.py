"""The base model's manifest, `{run}/base_model.json`: every file of the model directory the run trains from (its
path relative to the directory, size and digest), written when the pipeline resolves the model, from its own copy
(the pipeline always has one: staging tokenizes with it). Every node's preflight holds its own copy against it before
a rank starts, so a missing, short or different file (an interrupted copy to a node, another revision of the model)
stops the job in one line naming the node and the file, instead of a rank's crash or, worse, a silent mix of two
models. Digests of local files come from the node cache (storage/node_cache.py): a model is hashed once per machine,
not at every launch or retry. Symlinks are followed (a Hugging Face cache's snapshot points into its blobs); hidden
files and directories (`.cache`, `.git`, lock files) are not part of the model. Before the pipeline's copy is
digested, its weights files are read by their headers (storage/weights.py), so a download cut short is named first.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from core.errors import UserError
from storage import layout
from storage.digest import digest_bytes
from storage.fs import exists, read_bytes, write_json_atomic
from storage.location import Location, join
from storage.node_cache import file_digest
from storage.weights import check_weights


def model_files(model_dir: str) -> list[str]:
    """The model's files, relative to its directory, sorted: every regular file (symlinks followed), hidden ones out."""
    root = Path(model_dir)
    found: list[str] = []
    for folder, dirs, files in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(
            os.path.relpath(os.path.join(folder, name), root)
            for name in files
            if not name.startswith(".") and os.path.isfile(os.path.join(folder, name))
        )
    return sorted(found)


def describe(model_dir: str, algorithm: str, cache: Path) -> dict[str, Any]:
    """The manifest of a local model directory: a function of its files alone, so that the same model always gets
    the same manifest digest (in the lineage of every run trained from it)."""
    if not os.path.isdir(model_dir):
        raise UserError(f"model.name_or_path {model_dir}: not a directory; give the model's local directory")
    relatives = model_files(model_dir)
    check_weights(model_dir, relatives)  # headers first: a broken download is named before minutes of hashing
    files = []
    for relative in relatives:
        path = os.path.join(model_dir, relative)
        digest, _ = file_digest(path, algorithm, cache)
        files.append({"path": relative, "size": os.stat(path).st_size, "digest": digest})
    if not files:
        raise UserError(f"model.name_or_path {model_dir}: the directory is empty; give the model's local directory")
    return {
        "schema": layout.BASE_MODEL_SCHEMA,
        "digest_algorithm": algorithm,
        "files": files,
        "bytes": sum(f["size"] for f in files),
    }


def record_base_model(run_url: Location, model_dir: str, algorithm: str, cache: Path) -> str:
    """Write {run}/base_model.json for the model at `model_dir`; returns the sha256 of its bytes (the spec and the
    lineage carry it)."""
    raw = write_json_atomic(join(run_url, layout.BASE_MODEL), describe(model_dir, algorithm, cache))
    return digest_bytes(raw, "sha256")


def read_base_model(run_url: Location, expected_digest: str) -> dict[str, Any]:
    """{run}/base_model.json, checked against the digest spec.json recorded for it."""
    url = join(run_url, layout.BASE_MODEL)
    if not exists(url):
        raise UserError(f"{url}: missing; run the pipeline again to record the base model")
    raw = read_bytes(url)
    if digest_bytes(raw, "sha256") != expected_digest:
        raise UserError(f"{url}: not the manifest spec.json recorded (sha256 differs); run the pipeline again")
    doc: dict[str, Any] = json.loads(raw)
    if doc.get("schema") != layout.BASE_MODEL_SCHEMA:
        raise UserError(f"{url}: schema {doc.get('schema')!r} is not {layout.BASE_MODEL_SCHEMA!r}")
    return doc


def verify_local_model(manifest: dict[str, Any], model_dir: str, cache: Path) -> tuple[int, int]:
    """Hold the local directory against the manifest: every file present, of its size and digest. Returns (files,
    digests found in the node cache); raises a UserError naming the first file that differs and how."""
    cached = 0
    algorithm = manifest["digest_algorithm"]
    for entry in manifest["files"]:
        path = os.path.join(model_dir, entry["path"])
        if not os.path.isfile(path):
            raise UserError(f"{path}: missing; copy the whole model directory to this node again")
        size = os.stat(path).st_size
        if size != entry["size"]:
            raise UserError(
                f"{path}: {size} bytes, the pipeline's copy has {entry['size']} (an interrupted copy?); copy the "
                "file to this node again"
            )
        digest, hit = file_digest(path, algorithm, cache)
        cached += hit
        if digest != entry["digest"]:
            raise UserError(
                f"{path}: {algorithm} {digest[:16]}…, the pipeline's copy has {entry['digest'][:16]}… (another "
                "revision, or a corrupted copy); copy the model directory to this node again"
            )
    return len(manifest["files"]), cached
