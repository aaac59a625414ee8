"""Progress of the prepare step: bars on a terminal, periodic lines in the log (Prefect's) otherwise.

Either way every phase ends with one summary line in the log, so a run's log tells how long each part took.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Sink = Callable[[str], None]
LOG_EVERY_S = 10.0


def _human(value: float, unit: str) -> str:
    if unit != "B":
        return f"{int(value):,} {unit}"
    for suffix in ("B", "KB", "MB", "GB"):
        if value < 1000 or suffix == "GB":
            return f"{value:.1f} {suffix}" if suffix != "B" else f"{int(value)} B"
        value /= 1000
    raise AssertionError("unreachable")


class Phase:
    """One measured part of the work (reading, tokenizing, ...)."""

    def __init__(self, name: str, total: int, unit: str, sink: Sink, bar: Any) -> None:
        self.name, self.total, self.unit, self.sink, self.bar = name, total, unit, sink, bar
        self.done = 0
        self.note = ""
        self.started = self._last_log = time.monotonic()

    def update(self, amount: int) -> None:
        """Count `amount` more units of work."""
        self.done += amount
        if self.bar is not None:
            self.bar.update(amount)
            return
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            share = f"{100 * self.done / self.total:.0f}% " if self.total else ""
            self.sink(
                f"{self.name}: {share}({_human(self.done, self.unit)} of {_human(self.total, self.unit)})"
                + (f", {self.note}" if self.note else "")
            )

    def annotate(self, note: str) -> None:
        """A short status shown beside the count (e.g. shards written so far)."""
        self.note = note
        if self.bar is not None:
            self.bar.set_postfix_str(note, refresh=False)

    def finish(self) -> None:
        """Close the bar and log the phase's summary."""
        if self.bar is not None:
            self.bar.close()
        seconds = time.monotonic() - self.started
        self.sink(
            f"{self.name}: {_human(self.done, self.unit)} in {seconds:.1f} s" + (f", {self.note}" if self.note else "")
        )


class Reporter:
    """Messages to a sink (a logger's info), plus progress phases shown as bars when on a terminal."""

    def __init__(self, sink: Sink, bars: bool | None = None) -> None:
        self.sink = sink
        self.bars = sys.stderr.isatty() if bars is None else bars

    def info(self, message: str) -> None:
        """One line to the log."""
        self.sink(message)

    @contextmanager
    def phase(self, name: str, total: int, unit: str) -> Iterator[Phase]:
        """A phase of `total` units; its summary is logged when the block ends without an error."""
        bar = None
        if self.bars:
            from tqdm import tqdm

            bar = tqdm(
                total=total,
                desc=name,
                unit=unit,
                unit_scale=unit == "B",
                file=sys.stderr,
                leave=True,
                dynamic_ncols=True,
            )
        phase = Phase(name, total, unit, self.sink, bar)
        try:
            yield phase
        except BaseException:
            if bar is not None:
                bar.close()
            raise
        phase.finish()
