"""The job and node types every part of launch/ shares: what one phase runs on every node (`PhaseJob`), one node's
place in it (`NodePlan`), and the module and arguments the ranks run. The interface a backend implements is
launch/backend.py.

The bottom of launch/: it imports no backend and nothing that imports one, so that launch/phase.py may import the
backends and the backends may import this module without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from storage.location import Location
from storage.spec import WrittenSpec

# phase -> the module torchrun runs on every rank ("probe": only the network probe, e.g. to test a cluster's links)
MODULES = {"train": "trainer", "eval": "trainer.evaluate", "probe": "trainer.watch.probe"}

Info = Callable[[str], None]
OnProgress = Callable[[dict[str, Any]], None]


def trainer_args(spec: Location, phase: str, model_url: str | None = None) -> list[str]:
    """The arguments of `python -m trainer` / `python -m trainer.evaluate` for a phase. `--spec` is the spec.json's
    location in its command-line form (the URL, with its storage options when it has any: storage/location.py), so the
    rank reads it with the options that reach it."""
    return ["--spec", spec.argument()] + (["--model", model_url] if phase == "eval" and model_url else [])


def node_args(spec: Location, phase: str, model_url: str | None, spec_digest: str) -> list[str]:
    """The arguments of `python -m flows.node` (`--spec` as for trainer_args): with the digest the pipeline recorded
    for spec.json where the node preflights (train, probe), which checks it."""
    args = ["--spec", spec.argument(), "--phase", phase]
    if model_url:
        args += ["--model", model_url]
    if phase in ("train", "probe"):
        args += ["--spec-digest", spec_digest]
    return args


@dataclass(frozen=True)
class NodePlan:
    """What one node is asked to run: its place in the job and where the rendezvous is."""

    node_rank: int
    nnodes: int
    nproc_per_node: int
    master_addr: str
    master_port: int


@dataclass(frozen=True)
class PhaseJob:
    """What every node of one phase runs: the written spec, the phase, for eval the model to evaluate, and what the
    job adds to the ranks' environment (`env`: the transport's debug levels on a retry, launch/command.py
    `transport_debug_env`), which each backend hands to its nodes as a value, never through this process's
    environment."""

    written: WrittenSpec
    phase: str  # "train" | "eval" | "probe"
    model_url: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def module(self) -> str:
        """The module torchrun runs on every rank."""
        return MODULES[self.phase]

    @property
    def args(self) -> list[str]:
        """The arguments of that module."""
        return trainer_args(self.written.url, self.phase, self.model_url)

    @property
    def node_args(self) -> list[str]:
        """The arguments of `python -m flows.node` for this job on any node (srun, ssh, a pod)."""
        return node_args(self.written.url, self.phase, self.model_url, self.written.digest)
