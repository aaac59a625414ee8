"""Shared flow and command-line plumbing: the flow boundary (`enter`), `--config`/`--set`/`--print-config` parsing and
one-line errors with meaningful exit codes."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import yaml

from config.loader import DEFAULT_PRESET, check_paths, load_config
from config.schema import FinetuneConfig
from core.errors import TandemError
from core.redact import install_log_masking, mask_text
from launch.phase import run_backend
from storage.full import full_errno, full_storage_is_one_line


def enter(config: FinetuneConfig) -> FinetuneConfig:
    """The flow boundary, passed once per run: the config's local paths made absolute and checked and its launch
    backend held to what it asks (a config from the UI form has not been through the loader, nor the command line's
    check), and the log masking of launch.forward_env installed."""
    cfg = check_paths(config)
    run_backend(cfg)  # before anything starts: an elastic node range on a backend that cannot run one stops here
    install_log_masking(cfg.launch.forward_env)  # Prefect's handlers exist by now, the run logger's included
    return cfg


# The last lines of every config CLI's --help: where each key is documented.
REFERENCE_HINT = (
    "Every config key with its type, default, bounds and description: docs/reference/configuration.md in the "
    "repository, or the documentation site `make docs` builds (site/reference/configuration.html)."
)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """--config FILE, repeated --set KEY=VALUE and --print-config; --help ends with where the keys are documented."""
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
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config of this command line as YAML and exit, running nothing",
    )
    parser.epilog = REFERENCE_HINT


class HideUserErrors(logging.Filter):
    """Keeps Prefect's console from printing a TandemError (with its traceback) that the CLI prints as one line.

    Only console handlers get this filter: the run's logs in Prefect (the API handler) keep everything.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """False for Prefect's records about a TandemError, or a full disk (which run_cli prints as one line)."""
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, TandemError) or (error is not None and full_errno(error) is not None):
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
        # Every write of ours names a full disk itself (storage/fs.py StorageFull); this catches a library's own.
        with full_storage_is_one_line():
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


def config_yaml(document: dict[str, Any]) -> str:
    """A config (its JSON form) as YAML, every key in the schema's order: what --print-config prints, and what
    --config reads back."""
    return str(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))


def run_config_cli(args: argparse.Namespace, overrides: Sequence[str], body: Callable[[FinetuneConfig], int]) -> int:
    """Load the command line's config as a run does (the preset, the overrides, validation, local paths made
    absolute and checked, what its launch backend can do: launch/phase.py `run_backend`) and run `body` with it; with
    --print-config print it as YAML instead and run nothing. Errors as `run_cli`: one line, exit 2 for a bad value."""

    def load_and_run() -> int:
        cfg = load_config(args.config, list(overrides))
        run_backend(cfg)
        if args.print_config:
            print(config_yaml(cfg.model_dump(mode="json")), end="")
            return 0
        return body(cfg)

    return run_cli(load_and_run)
