"""The synchronous half of a background save: DeepSpeed's `save_checkpoint` runs as usual (its collectives, its
file names, its state dicts), but with `SnapshotEngine` as its checkpoint engine, every state dict it would have
written is copied to host memory instead, and the file is written later by the writer thread
(trainer/checkpointing/writer.py).

Why a copy and not a reference: the optimizer updates parameters and moments in place at the next step, so a
file written from live tensors would mix two steps. Why copy whole storages (as `copy.deepcopy` does) and not each
tensor: `torch.save` writes storages, so tensors that share one (a tied embedding, views of a flat ZeRO buffer)
stay shared and the file is the one the synchronous save writes.

When host memory is short (the copy would leave less than `HOST_RESERVE_FRACTION` of the node's memory free,
counting the other ranks of the node taking as much), the state is written straight to node-local disk instead, as
the synchronous save does; the writer then digests and uploads it in the background.
"""

from __future__ import annotations

import copy
import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointCommitInfo, CheckpointEngine

from core.meminfo import meminfo

log = logging.getLogger(__name__)
HOST_RESERVE_FRACTION = 0.15  # of MemTotal left free after the copies of every rank of the node


@dataclass
class Pending:
    """One file of a save: its state (a host copy) or None when it was written to `path` already."""

    path: str
    state: Any
    nbytes: int


@dataclass
class Snapshot:
    """What one rank's save left to write: files in DeepSpeed's order."""

    files: list[Pending] = field(default_factory=list)

    @property
    def host_bytes(self) -> int:
        return sum(f.nbytes for f in self.files if f.state is not None)


def _storages(obj: Any, seen: dict[tuple[str, int], int]) -> None:
    """Every distinct tensor storage under `obj` (key: device and address), with its size in bytes."""
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        seen[(str(storage.device), storage.data_ptr())] = storage.nbytes()
    elif isinstance(obj, dict):
        for value in obj.values():
            _storages(value, seen)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _storages(value, seen)


def state_bytes(obj: Any) -> int:
    """Bytes of the distinct storages `torch.save(obj)` would write."""
    seen: dict[tuple[str, int], int] = {}
    _storages(obj, seen)
    return sum(seen.values())


def fresh_buffer(nbytes: int, pinned: bool) -> torch.Tensor:
    """A new host buffer of `nbytes` bytes."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)


def host_copy(
    obj: Any,
    memo: dict[tuple[str, int], torch.UntypedStorage] | None = None,
    buffer: Callable[[int, bool], torch.Tensor] = fresh_buffer,
) -> Any:
    """A copy of a state dict whose tensors live in host storages from `buffer` (one per source storage, so sharing
    is kept; pinned when the source is on a GPU, so the copy runs at the link's speed), containers rebuilt and
    anything else deep-copied."""
    memo = {} if memo is None else memo
    if isinstance(obj, torch.Tensor):
        source = obj.untyped_storage()
        key = (str(source.device), source.data_ptr())
        storage = memo.get(key)
        if storage is None:
            raw = torch.empty(0, dtype=torch.uint8, device=source.device).set_(source)
            host = buffer(raw.numel(), raw.is_cuda)
            host.copy_(raw, non_blocking=raw.is_cuda)
            storage = memo[key] = host.untyped_storage()
        copied = torch.empty(0, dtype=obj.dtype).set_(storage, obj.storage_offset(), obj.size(), obj.stride())
        return torch.nn.Parameter(copied, obj.requires_grad) if isinstance(obj, torch.nn.Parameter) else copied
    if type(obj) in (dict, OrderedDict):
        return type(obj)((k, host_copy(v, memo, buffer)) for k, v in obj.items())
    if type(obj) in (list, tuple):
        return type(obj)(host_copy(v, memo, buffer) for v in obj)
    return copy.deepcopy(obj)


def host_budget(local_world: int) -> int:
    """Bytes this rank may copy to host memory now: MemAvailable less the reserve, shared by the node's ranks."""
    info = meminfo()
    free = info.get("MemAvailable", 0) - HOST_RESERVE_FRACTION * info.get("MemTotal", 0)
    return max(0, int(free // max(local_world, 1)))


class SnapshotEngine(CheckpointEngine):
    """A DeepSpeed checkpoint engine that records each state dict as a host copy (or, past the host budget, writes
    it to its path at once); `take()` hands over what one save recorded.

    The host buffers are kept for the next save, which needs the same sizes: a fresh allocation costs a page fault
    per page (0.5 s a GB here, far more when the kernel must first reclaim the page cache the last save filled), a
    copy into a buffer that is already there runs at memory speed (0.08 s a GB). So a rank that saved once holds
    one checkpoint's worth of host memory for the rest of the run, which is the most a save holds anyway. Buffers
    of the last save are reused only after its writer finished (the checkpointer starts no save before that)."""

    def __init__(self, local_world: int) -> None:
        super().__init__()
        self.name = "TandemSnapshot"
        self.local_world = local_world
        self.snapshot = Snapshot()
        self.budget = 0
        self.in_use: list[torch.Tensor] = []  # the buffers of the last save
        self.spare: dict[tuple[int, bool], list[torch.Tensor]] = {}  # the same, free again, by (size, pinned)

    def create(self, info: CheckpointCommitInfo) -> None:
        self.snapshot = Snapshot()
        for held in self.in_use:
            self.spare.setdefault((held.numel(), held.is_pinned()), []).append(held)
        self.in_use = []
        self.budget = host_budget(self.local_world) + sum(b.numel() for bs in self.spare.values() for b in bs)

    def _buffer(self, nbytes: int, pinned: bool) -> torch.Tensor:
        spare = self.spare.get((nbytes, pinned))
        held = spare.pop() if spare else fresh_buffer(nbytes, pinned)
        self.in_use.append(held)
        return held

    def save(self, state_dict: Any, path: str) -> None:
        nbytes = state_bytes(state_dict)
        if nbytes <= self.budget - self.snapshot.host_bytes:
            copied = host_copy(state_dict, buffer=self._buffer)
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the pinned copies were queued non-blocking
            self.snapshot.files.append(Pending(path, copied, nbytes))
            return
        log.info("host memory is short (%.2f GB to copy): writing %s to local disk now", nbytes / 1e9, path)
        torch.save(state_dict, path)
        self.snapshot.files.append(Pending(path, None, os.path.getsize(path)))

    def load(self, path: str, map_location: Any = None) -> Any:
        return torch.load(path, map_location=map_location, weights_only=False)

    def commit(self, info: CheckpointCommitInfo) -> bool:
        return True

    def preserves_storage_sharing(self) -> bool:
        return True

    def release(self) -> None:
        """Free every kept buffer (no save will come: the export needs the memory)."""
        self.in_use, self.spare = [], {}

    def take(self) -> Snapshot:
        """What the last save recorded (and forget it here); spare buffers this save did not need are freed."""
        snapshot, self.snapshot = self.snapshot, Snapshot()
        self.spare = {}
        return snapshot
