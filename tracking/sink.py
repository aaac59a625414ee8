"""The tracking sink interface and the tracker that feeds every sink from the pipeline process.

A sink mirrors one run into one tracking system (MLflow, TensorBoard, W&B). The tracker owns one background thread
per sink and hands it work in order; a sink that fails (its server is down) is retried with a growing pause until
it succeeds, so a tracking outage never fails or slows training: the train task only appends to a list.
Step metrics are logged by step number, each step once: a sink reports the last step it already has when it opens
(a retried or resumed run logs again from there), and the tracker never sends a step at or below it.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from core.errors import UserError
from core.redact import redact
from storage.location import Location

log = logging.getLogger(__name__)

# metrics.jsonl step keys that are mirrored (as train/{key}); `step`, `max_steps` and events are not metrics.
# The preference objectives' step metrics (reward_accuracy, reward_margin, kl) are mirrored when a line has them.
STEP_METRICS = (
    "loss",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "step_time_s",
    "padding_fraction",
    "target_tokens",
    "tokens",
    "reward_accuracy",
    "reward_margin",
    "kl",
)
# Online RL's step metrics (trainer/objectives/rl/, TRL's names): these, and every key under these prefixes (each reward
# function's rewards/<name>/mean and std, the completions' lengths, the clipped ratios).
RL_STEP_METRICS = ("reward", "reward_std", "frac_reward_zero_std", "entropy", "generation_s", "scoring_s", "logps_s")
RL_STEP_PREFIXES = ("rewards/", "completions/", "clip_ratio/")
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0


@dataclass(frozen=True)
class RunInfo:
    """What every sink needs to name and cross-link its run."""

    run_id: str
    run_url: Location
    flow_run_id: str | None
    flow_run_url: str | None  # the flow run in the Prefect UI, when the UI's URL is known


class Sink(Protocol):
    """One tracking system's view of a pipeline run. Every method may raise; the tracker retries it."""

    name: str

    def open(self, run: RunInfo) -> int:
        """Create or find this run's record; returns the last step it already holds (0 for a new one)."""

    def log_params(self, params: Mapping[str, str]) -> None:
        """Record the flattened config (params a record already holds are left as they are)."""

    def log_steps(self, records: list[dict[str, Any]]) -> None:
        """Record the step metrics of these metrics.jsonl step lines (train/{key} at their step)."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Record metrics at one step (eval/{key} after evaluation)."""

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Record tags (lineage digests, attempts, the Prefect flow run)."""

    def log_file(self, url: Location, name: str) -> None:
        """Attach a file of storage (the loss curve, the model card) as `name`."""

    def close(self, status: str) -> None:
        """End the record with `status` (FINISHED or FAILED)."""


def require(module: str, name: str, setting: str, off: str) -> Any:
    """Import a tracking package, or one UserError line naming Tandem's extra of the same name that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(
            f"{setting}: {name} is not installed in this environment: pip install "
            f"'tandem[{module}]' (or set {setting}={off})"
        ) from None


def first_line(exc: BaseException) -> str:
    """An exception as one short line (a tracking client's errors can span pages)."""
    return (str(exc).splitlines() or [type(exc).__name__])[0][:300]


def step_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """The mirrored metrics of one metrics.jsonl step line, as train/{key}."""
    keys = [*STEP_METRICS, *RL_STEP_METRICS, *(key for key in record if key.startswith(RL_STEP_PREFIXES))]
    return {f"train/{key}": float(record[key]) for key in keys if record.get(key) is not None}


def flatten(document: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as flat `section.key` -> text params, secret-looking values masked (core/redact.py)."""
    flat: dict[str, str] = {}
    for key, value in redact(dict(document)).items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = "" if value is None else str(value)
    return flat


class SinkWorker:
    """One sink's background thread: runs its calls in order, retrying each until it succeeds."""

    def __init__(self, sink: Sink, run: RunInfo) -> None:
        self.sink = sink
        self.last_step: int | None = None  # what the sink holds; None until it opened
        self._run = run
        self._calls: list[Callable[[], None]] = []
        self._steps: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._closing = False
        self._abandoned = False  # set when close() gave up waiting: the thread stops at its next retry
        self.failures = 0
        self._thread = threading.Thread(target=self._loop, name=f"track-{sink.name}", daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[Sink], None]) -> None:
        """Queue a call of the sink (after everything queued before it)."""
        with self._cond:
            self._calls.append(lambda: fn(self.sink))
            self._cond.notify()

    def steps(self, records: list[dict[str, Any]]) -> None:
        """Queue step lines; those at or below the sink's last step are dropped when sent."""
        with self._cond:
            self._steps.extend(records)
            self._cond.notify()

    def close(self, status: str, timeout_s: float) -> bool:
        """Queue the end of the record and wait up to `timeout_s` for everything to be delivered; False if not."""
        self.call(lambda sink: sink.close(status))
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout_s)
        self._abandoned = self._thread.is_alive()
        return not self._abandoned

    def pending(self) -> int:
        """Calls and step lines not delivered yet."""
        with self._cond:
            return len(self._calls) + len(self._steps)

    def _next(self) -> Callable[[], None] | None:
        with self._cond:
            while True:
                if self.last_step is None:
                    return self._open
                if self._steps:  # steps before calls: no call depends on them, and close() is queued after the last
                    records, self._steps = self._steps, []
                    return lambda: self._send_steps(records)
                if self._calls:
                    return self._calls.pop(0)
                if self._closing:
                    return None
                self._cond.wait()

    def _open(self) -> None:
        self.last_step = self.sink.open(self._run)

    def _send_steps(self, records: list[dict[str, Any]]) -> None:
        assert self.last_step is not None
        new: dict[int, dict[str, Any]] = {}
        for record in records:  # the first line of a step wins: a resumed run writes its steps again
            if record["step"] > self.last_step:
                new.setdefault(record["step"], record)
        if new:
            self.sink.log_steps([new[step] for step in sorted(new)])
            self.last_step = max(new)

    def _loop(self) -> None:
        pause = RETRY_FIRST_S
        work = self._next()
        while work is not None and not self._abandoned:
            try:
                work()
            except Exception as exc:  # noqa: BLE001 - a tracking outage must never reach training
                self.failures += 1
                if self.failures == 1 or self.failures % 10 == 0:
                    log.warning(
                        "%s: %s (failure %d; retrying in the background, training goes on)",
                        self.sink.name,
                        first_line(exc),
                        self.failures,
                    )
                time.sleep(pause)
                pause = min(pause * 2, RETRY_MAX_S)
                continue  # the same work again: every call is safe to repeat
            pause = RETRY_FIRST_S
            work = self._next()


class Tracker:
    """Every configured sink of one pipeline run, fed from the pipeline process (never from the ranks)."""

    def __init__(self, sinks: list[Sink], run: RunInfo) -> None:
        self.run = run
        self.workers = [SinkWorker(sink, run) for sink in sinks]

    def steps(self, records: list[dict[str, Any]]) -> None:
        """Forward metrics.jsonl lines; event lines are skipped, steps already sent are dropped."""
        lines = [record for record in records if "event" not in record and "step" in record]
        for worker in self.workers:
            worker.steps(lines)

    def call(self, fn: Callable[[Sink], None]) -> None:
        """Queue one call on every sink (sink.log_params(...), set_tags, log_metrics, log_file)."""
        for worker in self.workers:
            worker.call(fn)

    def close(self, status: str, timeout_s: float) -> list[str]:
        """End every record, waiting up to `timeout_s` in all; returns one line per sink left incomplete."""
        deadline = time.monotonic() + timeout_s
        incomplete = []
        for worker in self.workers:
            if not worker.close(status, max(0.0, deadline - time.monotonic())):
                incomplete.append(
                    f"{worker.sink.name}: {worker.pending()} update(s) not delivered within "
                    f"{timeout_s:.0f} s ({worker.failures} failed attempt(s)); its record of run "
                    f"{self.run.run_id} is incomplete, Tandem's files are not"
                )
        return incomplete
