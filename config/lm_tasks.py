"""Benchmark tasks' index (`eval.tasks`): lm-evaluation-harness installed, eval.tasks.include_path a directory of
this node, and every task name known to it; and the digest of your task files. Torch-free, so that each node's
preflight (launch/preflight.py) refuses a wrong name before training, and the evaluate stage again before it loads
a model; the tasks themselves run on the ranks (trainer/evaluation/lm_tasks.py).
"""

from __future__ import annotations

import hashlib
import os
from importlib import metadata
from pathlib import Path
from typing import Any

from config.sections.results import TasksConfig
from core.errors import UserError

HARNESS = "lm-eval"  # the distribution (the `tasks` extra pins it)
INSTALL = "pip install 'tandem[tasks]' on every node"


def harness_version() -> str:
    """The installed lm-evaluation-harness's version (a one-line refusal without it)."""
    try:
        return metadata.version(HARNESS)
    except metadata.PackageNotFoundError:
        raise UserError(f"eval.tasks needs lm-evaluation-harness, which is not installed here: {INSTALL}") from None


def include_dir(cfg: TasksConfig) -> Path | None:
    """eval.tasks.include_path as a directory of this node (a one-line refusal when it is not one)."""
    if cfg.include_path is None:
        return None
    path = Path(cfg.include_path).expanduser()
    if not path.is_dir():
        raise UserError(
            f"eval.tasks.include_path={cfg.include_path}: no such directory on {os.uname().nodename}; put your task "
            "YAML files (and the data they name) at that path on every node"
        )
    return path


def task_manager(cfg: TasksConfig) -> Any:
    """The harness's task index with eval.tasks.include_path, every name checked against it. Your own directory is
    indexed alone first: when it holds every named task, the harness's own (about 15,000 YAML files, seconds to index)
    are not read."""
    harness_version()
    from lm_eval.tasks import TaskManager

    path = include_dir(cfg)
    manager = None
    if path is not None:
        manager = TaskManager(include_path=str(path), include_defaults=False)
        if not set(cfg.names) <= set(manager.all_tasks):
            manager = None
    if manager is None:
        manager = TaskManager(include_path=str(path) if path else None)
    unknown = [name for name in cfg.names if name not in manager.all_tasks]
    if unknown:
        where = f" or in {path}" if path else " (your own go in a directory named by eval.tasks.include_path)"
        raise UserError(
            f"eval.tasks.names: no lm-evaluation-harness task or group {', '.join(unknown)} in version "
            f"{harness_version()}{where}; `lm-eval ls tasks` lists them"
        )
    return manager


def include_digest(cfg: TasksConfig) -> str | None:
    """sha256 over eval.tasks.include_path's files (relative paths and contents): your tasks and their data are part
    of what the base model's cached figures depend on (trainer/evaluation/base_model.py)."""
    path = include_dir(cfg)
    if path is None:
        return None
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + b"\0")
        with file.open("rb") as stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()
