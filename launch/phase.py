"""One phase (train or eval) on every node, through the configured launch backend.

A backend is one function `run(job, info, on_progress)` that gets `python -m trainer` (or `trainer.evaluate`)
running on every node and returns when all of them finished, or raises naming the first node that failed
(UserError: retrying cannot help; RetryableError: it may). Adding a backend is one module and one entry in
BACKENDS; nothing above this module changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from launch.command import MODULES, trainer_args
from storage.spec import WrittenSpec

Info = Callable[[str], None]
OnProgress = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class PhaseJob:
    """What every node of one phase runs: the written spec, the phase, and for eval the model to evaluate."""

    written: WrittenSpec
    phase: str  # "train" | "eval"
    model_url: str | None = None

    @property
    def module(self) -> str:
        """The module torchrun runs on every rank."""
        return MODULES[self.phase]

    @property
    def args(self) -> list[str]:
        """The arguments of that module."""
        return trainer_args(self.written.url, self.phase, self.model_url)


Backend = Callable[[PhaseJob, Info, "OnProgress | None"], None]


def backends() -> dict[str, Backend]:
    """launch.backend -> its run function (imported here so that a backend's dependencies load only when used)."""
    from launch.local_nodes import run_local_job
    from launch.prefect_nodes import run_prefect_nodes
    from launch.slurm_nodes import run_slurm_nodes
    from launch.ssh_nodes import run_ssh_nodes

    return {"local": run_local_job, "prefect": run_prefect_nodes, "slurm": run_slurm_nodes, "ssh": run_ssh_nodes}


def run_phase(written: WrittenSpec, phase: str, info: Info, *, model_url: str | None = None,
              on_progress: OnProgress | None = None) -> None:
    """Run `phase` on every node and return when all finished; preflight precedes training on each node
    (in this process for the local backend, inside each node's own process otherwise)."""
    backends()[written.spec.config.launch.backend](PhaseJob(written, phase, model_url), info, on_progress)
