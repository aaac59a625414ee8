"""Print the reliability table from the chaos suite's results: scenario, runs, passed, median time to detect,
data lost.

    python -m tests.chaos.summary [RESULTS.jsonl] [--since ISO-TIME]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from tests.chaos.conftest import RESULTS


def table(rows: list[dict]) -> str:
    """Markdown table, one line per scenario, in the order scenarios first appear."""
    by_scenario: dict[str, list[dict]] = {}
    for row in rows:
        by_scenario.setdefault(row["scenario"], []).append(row)
    lines = ["| scenario | runs | passed | median time to detect | data lost |", "|---|---|---|---|---|"]
    for scenario, runs in by_scenario.items():
        detects = [r["detect_s"] for r in runs if r.get("detect_s") is not None]
        detect = f"{statistics.median(detects):.1f} s" if detects else "n/a"
        lost = sum(1 for r in runs if r.get("data_lost"))
        unknown = sum(1 for r in runs if r.get("data_lost") is None)
        lost_text = f"{lost} of {len(runs)} runs" if lost else "none"
        if unknown:
            lost_text += f" ({unknown} not checked)"
        passed = sum(1 for r in runs if r["passed"])
        lines.append(f"| {scenario} | {len(runs)} | {passed} | {detect} | {lost_text} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos.summary", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results", nargs="?", default=str(RESULTS))
    parser.add_argument("--since", default="", help="only rows recorded at or after this time (ISO 8601)")
    args = parser.parse_args(argv)
    path = Path(args.results)
    if not path.exists():
        print(f"error: {path}: no results yet; run `make chaos` (or pytest -m chaos) first", file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [row for row in rows if row.get("at", "") >= args.since]
    print(table(rows))
    failed = sum(1 for row in rows if not row["passed"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
