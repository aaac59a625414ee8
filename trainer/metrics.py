"""Rank-0 side effects: metrics.jsonl lines and the one-line log summary, through one helper."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from storage import layout
from storage.fs import exists, makedirs, read_bytes, write_bytes_atomic
from storage.location import Location, is_local, join, local_path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepStats:
    """One optimizer step, reduced over every rank, plus this rank's compute time."""

    loss: float
    target_tokens: int
    tokens: int
    padding_fraction: float
    compute_s: float


class MetricsWriter:
    """Appends one JSON line per logged step to {run}/metrics.jsonl; a no-op on ranks other than 0."""

    def __init__(self, run_url: Location, enabled: bool, start_step: int) -> None:
        self.url = join(run_url, layout.METRICS)
        self.enabled = enabled
        self._lines: list[str] = []  # the whole file: object stores cannot append
        if enabled and exists(self.url):
            # Resuming at start_step: lines written after that checkpoint by the failed attempt are
            # dropped, so the file reads as one uninterrupted run.
            kept = [
                line
                for line in read_bytes(self.url).decode().splitlines()
                if line.strip() and json.loads(line)["step"] <= start_step
            ]
            write_bytes_atomic(self.url, "".join(f"{line}\n" for line in kept).encode())
            self._lines = kept

    def write(self, record: dict[str, Any]) -> None:
        """Record one step's metrics."""
        if not self.enabled:
            return
        line = json.dumps(record, sort_keys=True)
        if "event" in record:
            self._append(line)
            return
        self._append(line)
        log.info(
            "step %d/%d loss %.4f lr %.2e grad_norm %.3f tokens %d (padding %.1f%%) tokens/s %.0f",
            record["step"],
            record["max_steps"],
            record["loss"],
            record["lr"],
            record["grad_norm"],
            record["tokens"],
            100 * record["padding_fraction"],
            record["tokens_per_s"],
        )

    def _append(self, line: str) -> None:
        if is_local(self.url):
            path = local_path(self.url)
            makedirs(self.url.with_url(path.rsplit("/", 1)[0]))
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(line + "\n")
        else:
            self._lines.append(line)
            write_bytes_atomic(self.url, ("\n".join(self._lines) + "\n").encode())


def host_memory() -> dict[str, float]:
    """This process's resident memory in GB from /proc/self/status: `rss_anon_gb` (its own: tensors, Python objects),
    `rss_file_gb` (mapped files: libraries, memory-mapped data, the kernel can drop and re-read them), `peak_rss_gb`
    (the most it held at once, both kinds); empty where /proc is not there."""
    fields = {"RssAnon": "rss_anon_gb", "RssFile": "rss_file_gb", "VmHWM": "peak_rss_gb"}
    out: dict[str, float] = {}
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in fields:
                    out[fields[key]] = round(int(value.split()[0]) / 2**20, 3)  # kB
    except OSError:
        return {}
    return out


def log_memory(phase: str) -> None:
    """One log line of this rank's host memory at a point of its life (the model loaded, the engine built)."""
    memory = host_memory()
    if memory:
        log.info(
            "memory, %s: anonymous %.2f GB, file-backed %.2f GB, peak %.2f GB",
            phase,
            memory["rss_anon_gb"],
            memory["rss_file_gb"],
            memory["peak_rss_gb"],
        )


def peak_device_memory() -> dict[str, float]:
    """{"peak_memory_gb": the most GPU memory this rank's tensors held since the last call}, then starts over;
    nothing on a CPU (a process's tensors there are not counted apart from the rest of its memory)."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    return {"peak_memory_gb": round(peak, 3)}
