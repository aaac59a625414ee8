"""An elastic run's next attempt asks its backend (launch/elastic.py `attempt_on`): the backend probes every slot and
makes the attempt's launch section; elastic.py knows no backend by name. The backend here is a stand-in that refuses
one slot; the world-size rules of the attempts are tests/unit/test_elastic_config.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from config.sections.launch import LaunchConfig
from launch.backends.kubernetes import KubernetesBackend
from launch.backends.local import LocalBackend
from launch.elastic import attempt_on
from storage.spec import Attempt, Spec
from tests.unit.test_elastic_config import spec_for


@dataclass
class Refusing:
    """Probes every slot, refusing `bad`; its attempts' sections name their slots in launch.env."""

    bad: int
    probed: list[int] = field(default_factory=list)

    def probe(self, spec: Spec, slot: int) -> str | None:
        self.probed.append(slot)
        return f"node {slot}: gone" if slot == self.bad else None

    def attempt_launch(self, launch: LaunchConfig, attempt: Attempt) -> LaunchConfig:
        return launch.model_copy(update={"nnodes": len(attempt.nodes), "env": {"SLOTS": str(attempt.nodes)}})


def test_the_backend_probes_the_slots_and_makes_the_attempts_section(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, ["launch.nnodes=3", "launch.min_nnodes=2"])
    backend = Refusing(bad=1)
    attempt, launch = attempt_on(backend, spec, [])  # type: ignore[arg-type] - a partial stand-in
    assert backend.probed == [0, 1, 2]
    assert (attempt.nodes, attempt.left_out) == ([0, 2], {"1": "node 1: gone"})
    assert (launch.nnodes, launch.env) == (2, {"SLOTS": "[0, 2]"})


def test_pods_are_not_probed_ahead_and_local_slots_are(tmp_path: Path) -> None:
    """The cluster's scheduler places pods (each preflights its own node); this machine's slots get preflight's
    node-local checks, which a healthy slot passes."""
    spec = spec_for(tmp_path, ["launch.nnodes=2", "launch.min_nnodes=1"])
    assert [KubernetesBackend().probe(spec, slot) for slot in range(2)] == [None, None]
    assert LocalBackend().probe(spec, 0) is None
    attempt, launch = attempt_on(LocalBackend(), spec, [])
    assert (attempt.nodes, launch.nnodes, launch.hosts) == ([0, 1], 2, spec.config.launch.hosts)
