"""The job and node types every part of launch/ shares: what one phase runs on every node (`PhaseJob`), the phase
itself (`Phase`: train, eval or probe), one node's place in it (`NodePlan`), and the module and arguments the ranks
run. The interface a backend implements is launch/backend.py.

The bottom of launch/: it imports no backend and nothing that imports one, so that launch/phase.py may import the
backends and the backends may import this module without a cycle.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from storage.location import Location
from storage.spec import WrittenSpec

# The module every node process runs (`python -m launch.node`): what srun, ssh, a pod and a user by hand start.
NODE_MODULE = "launch.node"

Info = Callable[[str], None]
OnProgress = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Phase:
    """One kind of launch: its name (on the command line, in file and object names, in status.json), the module
    torchrun runs on every rank, whether each node runs preflight before its agent (and so checks spec.json's digest),
    and whether it evaluates a model (`--model`). The three are the constants below; a name becomes one once, at the
    edge (`Phase.named`: `--phase`, the node flow's parameter)."""

    name: str
    module: str
    preflights: bool
    takes_model: bool

    def __str__(self) -> str:
        return self.name

    @classmethod
    def named(cls, name: str) -> Phase:
        """The phase of a name; ValueError naming the choices for another."""
        try:
            return PHASES[name]
        except KeyError:
            raise ValueError(f"phase {name!r} is none of {', '.join(PHASES)}") from None


TRAIN = Phase("train", "trainer", preflights=True, takes_model=False)
EVAL = Phase("eval", "trainer.evaluate", preflights=False, takes_model=True)
# Only the network probe, e.g. to test a cluster's links (`python -m launch.node --phase probe`).
PROBE = Phase("probe", "trainer.watch.probe", preflights=True, takes_model=False)
PHASES = {phase.name: phase for phase in (TRAIN, EVAL, PROBE)}


def phase_argument(text: str) -> Phase:
    """argparse's `type=` for `--phase`: an unknown name is argparse's one-line error (exit 2)."""
    try:
        return Phase.named(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def trainer_args(spec: Location, phase: Phase, model: Location | None = None) -> list[str]:
    """The arguments of `python -m trainer` / `python -m trainer.evaluate` for a phase. `--spec` and `--model` are
    locations in their command-line form (the URL, with its storage options when it has any: storage/location.py), so
    the rank reads them with the options that reach them."""
    args = ["--spec", spec.argument()]
    if phase.takes_model and model is not None:
        args += ["--model", model.argument()]
    return args


def node_args(spec: Location, phase: Phase, model: Location | None, spec_digest: str) -> list[str]:
    """The arguments of `python -m launch.node` (`--spec` and `--model` as for trainer_args): with the digest the
    pipeline recorded for spec.json where the node preflights (train, probe), which checks it."""
    args = ["--spec", spec.argument(), "--phase", phase.name]
    if phase.takes_model and model is not None:
        args += ["--model", model.argument()]
    if phase.preflights:
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
    """What every node of one phase runs: the written spec, the phase, for eval the model to evaluate (a location
    under the run's storage, with its options), and what the job adds to the ranks' environment (`env`: the
    transport's debug levels on a retry, launch/command.py `transport_debug_env`), which each backend hands to its
    nodes as a value, never through this process's environment."""

    written: WrittenSpec
    phase: Phase
    model: Location | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def module(self) -> str:
        """The module torchrun runs on every rank."""
        return self.phase.module

    @property
    def args(self) -> list[str]:
        """The arguments of that module."""
        return trainer_args(self.written.url, self.phase, self.model)

    @property
    def node_args(self) -> list[str]:
        """The arguments of `python -m launch.node` for this job on any node (srun, ssh, a pod)."""
        return node_args(self.written.url, self.phase, self.model, self.written.digest)
