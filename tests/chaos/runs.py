"""Helpers the scenarios share: flipping bytes, waiting, finding a run's processes, and checking that
storage holds nothing half-written under a final name."""

from __future__ import annotations

import json
import random
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from core.errors import UserError
from storage import layout
from storage.checkpoints import read_complete, step_of
from storage.location import Location
from storage.manifest import verify_files


def flip_byte(path: Path, rng: random.Random) -> tuple[int, bytes]:
    """Flip one random bit of one random byte in place (same size: only a digest can tell); returns
    (offset, the new bytes of the file)."""
    data = bytearray(path.read_bytes())
    offset = rng.randrange(len(data))
    data[offset] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return offset, bytes(data)


def wait_for(predicate: Callable[[], object], timeout: float, what: str, every: float = 0.05) -> float:
    """Seconds until predicate() held; AssertionError naming `what` after `timeout`."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)
    return time.monotonic() - started


def processes(pattern: str) -> list[tuple[int, str]]:
    """(pid, command line) of every process whose command line matches `pattern` (pgrep -f)."""
    out = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout
    return [(int(pid), cmd) for pid, _, cmd in (line.partition(" ") for line in out.splitlines())]


def run_processes(run_name: str) -> list[tuple[int, str]]:
    """Every torchrun agent and rank (train or eval) of the run called `run_name`."""
    return processes(f"(torch.distributed.run|-m trainer).*/runs/{run_name}/")


def steps_logged(run_dir: Path) -> list[int]:
    """Steps in the run's metrics.jsonl so far (lines still being written are skipped)."""
    path = run_dir / layout.METRICS
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "event" not in record:
            steps.append(record["step"])
    return steps


def half_written(storage: Path) -> list[str]:
    """What a reader could take for whole but is not, anywhere under `storage` (empty when all is well):

    a JSON document or metrics line that does not parse; a dataset directory, checkpoint or exported
    model that claims to be whole (manifest, COMPLETE) but whose files do not match it. A directory
    without its marker is fine: readers ignore it.
    """
    problems = []
    for path in storage.rglob("*"):
        if path.is_file() and path.suffix == ".json" and not _parses(path.read_bytes()):
            problems.append(f"{path}: not valid JSON")
        if path.is_file() and path.name == layout.METRICS:
            problems += [
                f"{path}: line {i + 1} is cut"
                for i, line in enumerate(path.read_text().splitlines())
                if not _parses(line.encode())
            ]
    for manifest in (storage / "datasets").glob(f"*/{layout.MANIFEST}"):
        problems += _verify(manifest.parent)
    for run in (storage / "runs").glob("*"):
        for ckpt in (run / "checkpoints").glob("*"):
            if step_of(ckpt.name) is not None and read_complete(Location(str(ckpt))) is not None:
                problems += _verify(ckpt)
        if (run / "final" / layout.COMPLETE).exists():
            problems += _verify(run / "final")
    return problems


def _parses(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


def _verify(directory: Path) -> list[str]:
    try:
        verify_files(Location(str(directory)), json.loads((directory / layout.MANIFEST).read_bytes()), mode="full")
    except (UserError, ValueError, KeyError) as exc:
        return [f"{directory}: {exc}"]
    return []
