"""Reading {run}/metrics.jsonl, the rank-0 log of steps and events (written by trainer/metrics.py; the format is
in docs/architecture.md)."""

from __future__ import annotations

import json
from typing import Any

from config.sections.results import PREFERENCE_METRICS, SFT_METRICS
from storage import layout
from storage.fs import exists, read_bytes
from storage.location import Location, join

# eval.json's counts beside its metrics: supervised (tokens) and preference (units: pairs or KTO answers) evaluation.
SFT_COUNTS = ("loss_sum", "target_tokens", "correct_tokens", "examples")
PREFERENCE_COUNTS = ("units",)


def eval_metric_keys(result: dict[str, Any]) -> tuple[str, ...]:
    """The headline metrics of an eval.json (or a registry entry's metrics): a preference objective's when it has
    them (trainer/objectives/preference/), else supervised evaluation's."""
    return ("loss", *(PREFERENCE_METRICS if "reward_accuracy" in result else SFT_METRICS))


def eval_record_keys(result: dict[str, Any]) -> tuple[str, ...]:
    """The metrics and counts of an eval.json that a registry entry keeps."""
    return (*eval_metric_keys(result), *(PREFERENCE_COUNTS if "reward_accuracy" in result else SFT_COUNTS))


def read_metrics(run_url: Location) -> list[dict[str, Any]]:
    """Every record of {run}/metrics.jsonl (steps and events), in file order."""
    url = join(run_url, layout.METRICS)
    if not exists(url):
        return []
    return [json.loads(line) for line in read_bytes(url).decode().splitlines() if line.strip()]
