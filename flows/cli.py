"""Shared command-line plumbing: `--config`/`--set` parsing and one-line errors with meaningful exit codes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from config.errors import TandemError
from config.loader import DEFAULT_PRESET


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """--config FILE and repeated --set KEY=VALUE."""
    parser.add_argument("--config", metavar="FILE", default=None,
                        help=f"YAML config or preset name in config/presets (default: {DEFAULT_PRESET})")
    parser.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
                        help="override one config value, e.g. --set train.max_steps=50 (repeatable)")


def run_cli(body: Callable[[], int]) -> int:
    """Run `body`; a TandemError becomes one line on stderr and its exit code, not a traceback."""
    try:
        return body()
    except TandemError as exc:
        first_line, _, rest = str(exc).partition("\n")
        print(f"error: {first_line}", file=sys.stderr)
        if rest:
            print(rest, file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
