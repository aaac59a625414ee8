"""A model's weights files read by their headers before any rank loads them: a safetensors file cut short (a download
that stopped), one whose header is not safetensors', a shard that `model.safetensors.index.json` names but the
directory lacks, a PyTorch zip archive without its directory. Each is one line naming the file, what is wrong with
it and "download it again", instead of a rank's deserializing error minutes later. Only headers are read (the first
bytes of a safetensors file, the last of a zip), so a 60 GB model is checked in milliseconds.
"""

from __future__ import annotations

import json
import os
import zipfile
from typing import Any

from core.errors import UserError

SAFETENSORS_INDEX = "model.safetensors.index.json"
HEADER_MAX_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit on the header
FIX = "download it again (or copy it again from a good copy)"


def check_weights(model_dir: str, files: list[str]) -> int:
    """Every weights file among `files` (relative to `model_dir`) readable by its header, and every shard the index
    names present; returns how many weights files were checked. Raises a UserError naming the first broken file."""
    checked = 0
    for relative in files:
        path, name = os.path.join(model_dir, relative), os.path.basename(relative)
        if name.endswith(".safetensors"):
            check_safetensors(path)
            checked += 1
        elif name.endswith(".bin") and looks_like_zip(path):
            if not zipfile.is_zipfile(path):  # its directory, at the end of the file, is gone
                raise UserError(f"{path}: truncated: a PyTorch archive without its directory at the end; {FIX}")
            checked += 1
        elif name.endswith(".index.json"):
            check_index(model_dir, relative, set(files))
    return checked


def check_safetensors(path: str) -> None:
    """The header's length, its JSON, and the tensors' byte ranges against the file's size."""
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise UserError(f"{path}: {size} bytes, too short for a safetensors header (truncated); {FIX}")
        length = int.from_bytes(prefix, "little")
        if length > HEADER_MAX_BYTES:
            raise UserError(f"{path}: not a safetensors file (its header claims {length} bytes); {FIX}")
        if 8 + length > size:
            raise UserError(f"{path}: truncated: {size} bytes, its header alone needs {8 + length}; {FIX}")
        raw = handle.read(length)
    try:
        header = json.loads(raw)
    except ValueError:
        raise UserError(f"{path}: its safetensors header is not valid JSON (a corrupted file); {FIX}") from None
    needed = data_bytes(path, header)
    if 8 + length + needed > size:
        raise UserError(
            f"{path}: truncated: {size} bytes, its header describes {8 + length + needed} "
            f"({8 + length + needed - size} missing); {FIX}"
        )


def data_bytes(path: str, header: Any) -> int:
    """The bytes the header's tensors span after it (the end of the furthest byte range)."""
    if not isinstance(header, dict):
        raise UserError(f"{path}: its safetensors header is not a table of tensors (a corrupted file); {FIX}")
    end = 0
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        offsets = tensor.get("data_offsets") if isinstance(tensor, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise UserError(f"{path}: tensor {name!r} has no byte range in the header (a corrupted file); {FIX}")
        end = max(end, offsets[1])
    return end


def check_index(model_dir: str, relative: str, present: set[str]) -> None:
    """Every shard a sharded checkpoint's index names is in the directory."""
    path = os.path.join(model_dir, relative)
    try:
        with open(path, "rb") as handle:
            index = json.loads(handle.read())
    except ValueError:
        raise UserError(f"{path}: not valid JSON (a corrupted file); {FIX}") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        return  # not a shard index of the form transformers writes: its loader decides
    folder = os.path.dirname(relative)
    for shard in sorted(set(weight_map.values())):
        if os.path.normpath(os.path.join(folder, shard)) not in present:
            raise UserError(f"{os.path.join(model_dir, folder, shard)}: named in {relative} but missing; {FIX}")


def looks_like_zip(path: str) -> bool:
    """Whether a file starts as a zip archive does (PyTorch's .bin since 1.6), whatever its end."""
    with open(path, "rb") as handle:
        return handle.read(4) == b"PK\x03\x04"
