"""Shared flow and command-line plumbing: the flow boundary (`enter`), `--config`/`--set` parsing and one-line
errors with meaningful exit codes."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from config.loader import DEFAULT_PRESET, check_paths
from config.schema import FinetuneConfig
from core.errors import TandemError
from core.redact import install_log_masking, mask_text


def enter(config: FinetuneConfig) -> FinetuneConfig:
    """The flow boundary, passed once per run: the config's local paths made absolute and checked (a config from
    the UI form has not been through the loader), and the log masking of launch.forward_env installed."""
    cfg = check_paths(config)
    install_log_masking(cfg.launch.forward_env)  # Prefect's handlers exist by now, the run logger's included
    return cfg


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """--config FILE and repeated --set KEY=VALUE."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help=f"YAML config or preset name in config/presets (default: {DEFAULT_PRESET})",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one config value, e.g. --set train.max_steps=50 (repeatable)",
    )


class HideUserErrors(logging.Filter):
    """Keeps Prefect's console from printing a TandemError (with its traceback) that the CLI prints as one line.

    Only console handlers get this filter: the run's logs in Prefect (the API handler) keep everything.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """False for Prefect's records about a TandemError."""
        if record.exc_info and isinstance(record.exc_info[1], TandemError):
            return False
        if not record.name.startswith("prefect"):
            return True
        message = record.getMessage()
        return not any(f"{name}(" in message or f"{name}:" in message for name in _error_names(TandemError))


def _error_names(cls: type[BaseException]) -> set[str]:
    names: set[str] = {cls.__name__}
    for sub in cls.__subclasses__():
        names |= _error_names(sub)
    return names


def hide_user_errors_on_console() -> None:
    """Install HideUserErrors on the stream handlers of the root logger (Prefect's console handler)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not any(
            isinstance(f, HideUserErrors) for f in handler.filters
        ):
            handler.addFilter(HideUserErrors())


def run_cli(body: Callable[[], int]) -> int:
    """Run `body`; a TandemError becomes one line on stderr and its exit code, not a traceback."""
    hide_user_errors_on_console()
    install_log_masking()
    try:
        return body()
    except TandemError as exc:
        first_line, _, rest = mask_text(str(exc)).partition("\n")
        print(f"error: {first_line}", file=sys.stderr)
        if rest:
            print(rest, file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
