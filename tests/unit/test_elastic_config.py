"""The global batch as the invariant (train.global_batch_size) and the choice of nodes for an elastic attempt
(launch.min_nnodes/max_nnodes): plain functions, no processes."""

from __future__ import annotations

import re

import pytest

from config.loader import load_config
from core.errors import RetryableError, TooFewNodes, UserError
from launch.elastic import next_attempt
from pipeline.plan import total_steps
from storage.spec import Attempt
from tests.specs import spec_for


def test_accumulation_is_derived_from_the_global_batch_for_every_world_size() -> None:
    cfg = load_config(
        None,
        [
            "train.global_batch_size=12",
            "train.micro_batch_size=2",
            "launch.nnodes=3",
            "launch.min_nnodes=1",
            "launch.max_nnodes=3",
            "train.max_steps=",
        ],
    )
    assert [cfg.accumulation_steps(w) for w in (1, 2, 3)] == [6, 3, 2]
    assert {cfg.global_batch(w) for w in (1, 2, 3)} == {12}
    # Steps (hence the schedule) count global batches, whatever the world size.
    assert {total_steps(cfg.train, 120, w) for w in (1, 2, 3)} == {10}


def test_a_global_batch_that_does_not_divide_names_the_values_and_the_nearest_choices() -> None:
    with pytest.raises(UserError) as info:
        load_config(None, ["train.global_batch_size=10", "train.micro_batch_size=2", "launch.nnodes=3"])
    message = str(info.value)
    assert "\n" not in message
    assert (
        "train.global_batch_size=10 does not divide into train.micro_batch_size=2 x 3 ranks; nearest valid: "
        "train.global_batch_size=6 or 12"
    ) in message
    with pytest.raises(
        UserError,
        match=r"x 2 ranks \(world sizes 2..4 come from launch.min_nnodes..max_nnodes\); "
        r"nearest valid: train.global_batch_size=48, or train.micro_batch_size=1",
    ):
        load_config(
            None,
            [
                "train.global_batch_size=12",
                "train.micro_batch_size=4",
                "launch.nnodes=3",
                "launch.min_nnodes=2",
                "launch.max_nnodes=4",
            ],
        )


def test_elastic_nodes_need_a_global_batch_and_an_ordered_range() -> None:
    with pytest.raises(UserError, match=re.escape("launch.min_nnodes/max_nnodes need train.global_batch_size")):
        load_config(None, ["launch.nnodes=3", "launch.min_nnodes=2"])
    with pytest.raises(
        UserError,
        match=re.escape("only launch.backend=local, ssh or kubernetes picks the surviving nodes so far, not slurm"),
    ):
        load_config(
            None, ["launch.nnodes=3", "launch.min_nnodes=2", "train.global_batch_size=24", "launch.backend=slurm"]
        )
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


def test_a_checkpoint_of_another_stage_or_method_is_refused_naming_what_differs() -> None:
    from storage.checkpoints import CompleteCheckpoint
    from trainer.checkpointing.resume import check_compatible

    ckpt = CompleteCheckpoint(
        "/runs/r/checkpoints/step-00000008", 8, "d", {"world_size": 2, "zero_stage": 2, "method": "lora"}
    )
    check_compatible(ckpt, zero_stage=2, method="lora")  # another world size is converted, not refused
    with pytest.raises(UserError) as info:
        check_compatible(ckpt, zero_stage=3, method="full")
    assert str(info.value) == (
        "/runs/r/checkpoints/step-00000008 cannot resume this run: its ZeRO stage 2 (this run: 3) and train.method "
        "lora (this run: full) differ; resume with the same DeepSpeed stage and train.method, or set "
        "train.resume=never to start over"
    )


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
