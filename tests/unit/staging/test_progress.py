"""Progress of the prepare step: bars on a terminal, lines in the log otherwise, a summary line either way."""

from __future__ import annotations

import io
import sys

from staging import progress
from staging.progress import Reporter


def test_without_a_terminal_progress_goes_to_the_log(monkeypatch) -> None:
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    lines: list[str] = []
    with Reporter(lines.append, bars=False).phase("reading", 2_000_000, "B") as phase:
        phase.update(500_000)
        phase.annotate("2 shards written")
        phase.update(1_500_000)
    assert lines[0] == "reading: 25% (500.0 KB of 2.0 MB)"
    assert lines[1] == "reading: 100% (2.0 MB of 2.0 MB), 2 shards written"
    assert lines[2].startswith("reading: 2.0 MB in ") and lines[2].endswith(" s, 2 shards written")


def test_on_a_terminal_a_bar_is_drawn_and_the_summary_still_logged(monkeypatch) -> None:
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stderr", terminal)
    lines: list[str] = []
    with Reporter(lines.append, bars=True).phase("tokenizing", 10, "records") as phase:
        phase.update(10)
    assert "tokenizing: 100%" in terminal.getvalue() and "10/10" in terminal.getvalue()
    assert len(lines) == 1 and lines[0].startswith("tokenizing: 10 records in ")


def test_bars_are_chosen_by_whether_stderr_is_a_terminal(monkeypatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    assert Reporter(print).bars
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not Reporter(print).bars
