"""Reading {run}/metrics.jsonl, the rank-0 log of steps and events (written by trainer/metrics.py; the format is
in docs/architecture.md)."""

from __future__ import annotations

import json
from typing import Any

from storage import layout
from storage.fs import Where, exists, join, read_bytes


def read_metrics(run_url: Where) -> list[dict[str, Any]]:
    """Every record of {run}/metrics.jsonl (steps and events), in file order."""
    url = join(run_url, layout.METRICS)
    if not exists(url):
        return []
    return [json.loads(line) for line in read_bytes(url).decode().splitlines() if line.strip()]
