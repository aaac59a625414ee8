"""The promotion gate (`register.gate`): a metric against a threshold or against the champion.

A run that fails the gate is not an error: the registry stays untouched and the flow completes with
the message ("not registered: eval_loss 2.31 > threshold 2.0").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from config.sections.results import CHAMPION_METRIC, METRIC_DIRECTION, GateConfig
from storage.location import Location
from storage.metrics import metric_value
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
        assert gate.direction is not None  # GateConfig fills it in from the metric
        return gate.metric, gate.direction
    return CHAMPION_METRIC, METRIC_DIRECTION[CHAMPION_METRIC]


def check_gate(gate: GateConfig | None, metrics: dict[str, Any], storage: Location, model: str) -> GateResult:
    """Apply the gate to eval metrics (reading the champion from the registry when the gate needs it)."""
    if gate is None:
        return GateResult(True, "no gate configured")
    name, value = f"eval_{gate.metric}", metric_value(metrics, gate.metric)
    if value is None:
        return GateResult(False, f"not registered: {name} has no value in eval.json (docs/evaluation.md)")
    if gate.better_than is None:
        return bounds(gate, name, value)
    alias = champion(storage, model)
    if alias is None:
        return GateResult(True, f"passed: {name} {fmt(value)}, and {model} has no champion yet")
    theirs = metric_value(read_entry(storage, model, alias["version"])["metrics"], gate.metric)
    if theirs is None:
        return GateResult(True, f"passed: {name} {fmt(value)}, and champion v{alias['version']:04d} has none")
    ok = better(value, theirs, str(gate.direction))
    if ok:
        return GateResult(True, f"passed: {name} {fmt(value)} beats champion v{alias['version']:04d} ({fmt(theirs)})")
    return GateResult(
        False,
        f"not registered: {name} {fmt(value)} is not better than champion "
        f"v{alias['version']:04d} ({name} {fmt(theirs)})",
    )


def bounds(gate: GateConfig, name: str, value: float) -> GateResult:
    """The threshold (in the metric's direction) or the min/max bounds against the value."""
    if gate.threshold is not None:
        ok = value <= gate.threshold if gate.direction == "min" else value >= gate.threshold
        op = ("<=" if ok else ">") if gate.direction == "min" else (">=" if ok else "<")
        verdict = "passed" if ok else "not registered"
        return GateResult(ok, f"{verdict}: {name} {fmt(value)} {op} threshold {fmt(gate.threshold)}")
    checks = []
    if gate.min is not None:
        checks.append((value >= gate.min, f"{'>=' if value >= gate.min else '<'} min {fmt(gate.min)}"))
    if gate.max is not None:
        checks.append((value <= gate.max, f"{'<=' if value <= gate.max else '>'} max {fmt(gate.max)}"))
    ok = all(passed for passed, _ in checks)
    verdict = "passed" if ok else "not registered"
    return GateResult(ok, f"{verdict}: {name} {fmt(value)} " + " and ".join(text for _, text in checks))
