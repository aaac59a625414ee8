"""An elastic run's next attempt asks its backend (launch/elastic.py `attempt_on`): the backend probes every slot and
makes the attempt's launch section; elastic.py knows no backend by name. The backend here is a stand-in that refuses
one slot; the world-size rules of the attempts are tests/unit/test_elastic_config.py."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from config.loader import load_config
from config.sections.launch import LaunchConfig
from core.errors import RetryableError, TooFewNodes, UserError
from launch.backends.kubernetes import KubernetesBackend
from launch.backends.local import LocalBackend
from launch.elastic import attempt_on, next_attempt
from storage.spec import Attempt, Spec
from tests.specs import spec_for


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


def test_elastic_nodes_need_a_global_batch_and_an_ordered_range() -> None:
    with pytest.raises(UserError, match=re.escape("launch.min_nnodes/max_nnodes need train.global_batch_size")):
        load_config(None, ["launch.nnodes=3", "launch.min_nnodes=2"])
    with pytest.raises(
        UserError, match=re.escape("launch.max_nnodes=4: the ssh backend's nodes are the 3 hosts of launch.hosts")
    ):
        load_config(
            None,
            [
                "launch.backend=ssh",
                "launch.hosts=[a, b, c]",
                "launch.min_nnodes=2",
                "launch.max_nnodes=4",
                "train.global_batch_size=24",
            ],
        )
    with pytest.raises(UserError, match=re.escape("launch.min_nnodes=4 <= launch.nnodes=3")):
        load_config(None, ["launch.nnodes=3", "launch.min_nnodes=4", "train.global_batch_size=24"])


def test_an_attempt_takes_the_healthy_nodes_and_refuses_fewer_than_min(tmp_path) -> None:
    spec = spec_for(
        tmp_path, ["launch.nnodes=3", "launch.min_nnodes=2", "launch.max_nnodes=4", "train.global_batch_size=24"]
    )
    first = next_attempt(spec, [], lambda slot: None)
    assert (first.number, first.nodes, first.world_size, first.left_out) == (1, [0, 1, 2], 3, {})
    lost = next_attempt(spec, [first], lambda slot: "node 1: unreachable (lost)" if slot == 1 else None)
    # A retry may grow up to max_nnodes: slot 3 joins, slot 1 is left out with its reason.
    assert (lost.number, lost.nodes, lost.world_size) == (2, [0, 2, 3], 3)
    assert lost.left_out == {"1": "node 1: unreachable (lost)"}
    assert lost.describe() == (
        "attempt 2: nodes 0,2,3 (3 ranks) from step 0; node 1 left out: node 1: unreachable (lost)"
    )
    with pytest.raises(RetryableError, match=r"only 1 of 4 nodes passed preflight .* launch.min_nnodes=2"):
        next_attempt(spec, [first, lost], lambda slot: None if slot == 0 else f"node {slot}: unreachable")
    assert isinstance(first, Attempt)


def test_an_attempt_the_cluster_placed_in_part_is_capped_and_says_why(tmp_path) -> None:
    """Kubernetes: no probe places a pod ahead, so every slot passes and TooFewNodes caps the next attempt."""
    spec = spec_for(
        tmp_path,
        ["launch.nnodes=3", "launch.min_nnodes=1", "launch.max_nnodes=4", "train.global_batch_size=24"],
    )
    first = next_attempt(spec, [], lambda slot: None)
    short = TooFewNodes("train: not every pod runs after 900 s (pod p-2: 0/3 nodes are available)", 2)
    capped = next_attempt(spec, [first], lambda slot: None, short)
    # max_nnodes=4 asked, 2 placed: slots 2 and 3 left out with the scheduler's line.
    assert (capped.number, capped.nodes, capped.world_size) == (2, [0, 1], 2)
    assert capped.left_out == {"2": str(short), "3": str(short)}


def test_an_ssh_attempt_runs_on_the_hosts_that_answer(tmp_path) -> None:
    """The ssh backend's slots are launch.hosts: an attempt's section holds the hosts it runs on, node 0 first (the
    rendezvous moves to the first of them), and reloads as a valid config (spec.json is read back on every node)."""
    from config.schema import FinetuneConfig
    from launch.backends.ssh import SshBackend

    spec = spec_for(
        tmp_path,
        ["launch.backend=ssh", "launch.hosts=[n0, n1, n2]", "launch.min_nnodes=2", "train.global_batch_size=24"],
    )
    first = next_attempt(spec, [], lambda slot: None)
    lost = next_attempt(spec, [first], lambda slot: "node 0 (n0): ssh: connection refused" if slot == 0 else None)
    assert (lost.nodes, lost.world_size, lost.left_out) == ([1, 2], 2, {"0": "node 0 (n0): ssh: connection refused"})
    launch = SshBackend().attempt_launch(spec.config.launch, lost)
    assert (launch.hosts, launch.nnodes, launch.rendezvous_addr) == (["n1", "n2"], 2, "n1")
    FinetuneConfig.model_validate(spec.config.model_copy(update={"launch": launch}).model_dump())
