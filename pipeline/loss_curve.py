"""The loss curve: train loss per step from metrics.jsonl, eval loss points on top, as {run}/loss.png; for online RL
(train.objective=grpo), whose loss hovers near 0 by construction, the mean reward per step on a second axis, the
curve that shows it learning."""

from __future__ import annotations

import io
from typing import Any

from storage import layout
from storage.fs import write_bytes_atomic
from storage.location import Location, join
from storage.metrics import read_metrics

Series = tuple[list[int], list[float]]


def loss_series(records: list[dict[str, Any]], eval_points: list[tuple[int, float]]) -> tuple[Series, Series]:
    """((train steps, train losses), (eval steps, eval losses)) from metrics.jsonl records and extra points."""
    train = [(r["step"], r["loss"]) for r in records if "event" not in r and "loss" in r]
    # One eval point per step: the evaluated model's (eval.json) wins over the trainer's in-memory one.
    evals = {r["step"]: r["loss"] for r in records if r.get("event") == "final_eval"} | dict(eval_points)
    steps = sorted(evals)
    return ([s for s, _ in train], [v for _, v in train]), (steps, [evals[s] for s in steps])


def reward_series(records: list[dict[str, Any]]) -> Series:
    """(steps, mean rewards) of online RL's step lines (empty for other objectives)."""
    points = [(r["step"], r["reward"]) for r in records if "event" not in r and r.get("reward") is not None]
    return [s for s, _ in points], [v for _, v in points]


def render_png(train: Series, evals: Series, title: str, rewards: Series = ([], [])) -> bytes:
    """The plot as PNG bytes (matplotlib's Agg backend: no display needed); with `rewards` (online RL) the train
    rewards on a second axis, and the eval points there too, as rewards (online RL's eval loss is minus the reward)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=100)
    ax = fig.add_subplot()
    ax.plot(train[0], train[1], label="train loss", color="tab:blue", linewidth=1.5)
    if evals[0] and not rewards[0]:
        ax.scatter(evals[0], evals[1], label="eval loss", color="tab:red", zorder=3, s=36)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats per target token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    if rewards[0]:
        right = ax.twinx()
        right.plot(rewards[0], rewards[1], label="mean reward", color="tab:green", linewidth=1.5)
        if evals[0]:
            right.scatter(evals[0], [-v for v in evals[1]], label="eval reward", color="tab:red", zorder=3, s=36)
        right.set_ylabel("mean reward (train.rl.rewards)")
        right.legend(loc="upper right")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    return buffer.getvalue()


def write_loss_plot(run_url: Location, eval_points: list[tuple[int, float]], title: str) -> Location | None:
    """Write {run}/loss.png; returns its URL, or None when there are no train losses to plot."""
    records = read_metrics(run_url)
    train, evals = loss_series(records, eval_points)
    if not train[0]:
        return None
    url = join(run_url, layout.LOSS_PLOT)
    write_bytes_atomic(url, render_png(train, evals, title, reward_series(records)))
    return url
