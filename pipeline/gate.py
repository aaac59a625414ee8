"""The promotion gate (`register.gate`): a metric against a threshold or against the champion.

A run that fails the gate is not an error: the registry stays untouched and the flow completes with
the message ("not registered: eval_loss 2.31 > threshold 2.0").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from config.sections.results import CHAMPION_METRIC, METRIC_DIRECTION, GateConfig
from storage.location import Location
from storage.registry import better, champion, read_entry


@dataclass(frozen=True)
class GateResult:
    """Whether the model may be registered, and the sentence that says why."""

    passed: bool
    message: str


def fmt(value: float) -> str:
    """4 significant digits, always recognizably a float (2.0, not 2)."""
    text = f"{value:.4g}"
    return text if any(c in text for c in ".en") else f"{text}.0"


def ranking(gate: GateConfig | None) -> tuple[str, str]:
    """(metric, direction) the champion is chosen by: the gate's, else eval loss (lower is better)."""
    if gate is not None:
        return gate.metric, gate.direction
    return CHAMPION_METRIC, METRIC_DIRECTION[CHAMPION_METRIC]


def check_gate(gate: GateConfig | None, metrics: dict[str, Any], storage: Location, model: str) -> GateResult:
    """Apply the gate to eval metrics (reading the champion from the registry when the gate needs it)."""
    if gate is None:
        return GateResult(True, "no gate configured")
    name, value = f"eval_{gate.metric}", float(metrics[gate.metric])
    if gate.threshold is not None:
        ok = value <= gate.threshold if gate.direction == "min" else value >= gate.threshold
        op = ("<=" if ok else ">") if gate.direction == "min" else (">=" if ok else "<")
        verdict = "passed" if ok else "not registered"
        return GateResult(ok, f"{verdict}: {name} {fmt(value)} {op} threshold {fmt(gate.threshold)}")
    alias = champion(storage, model)
    if alias is None:
        return GateResult(True, f"passed: {name} {fmt(value)}, and {model} has no champion yet")
    theirs = float(read_entry(storage, model, alias["version"])["metrics"][gate.metric])
    ok = better(value, theirs, gate.direction)
    if ok:
        return GateResult(True, f"passed: {name} {fmt(value)} beats champion v{alias['version']:04d} ({fmt(theirs)})")
    return GateResult(
        False,
        f"not registered: {name} {fmt(value)} is not better than champion "
        f"v{alias['version']:04d} ({name} {fmt(theirs)})",
    )
