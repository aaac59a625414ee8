"""Sequence parallelism (train.sequence_parallel_size) through the real trainer: DeepSpeed's Ulysses on 2 gloo ranks of
one node splitting every row in two reproduces one rank's step losses, target tokens and final evaluation at the
same global batch (float rounding apart), and the split run's checkpoint resumed by two ranks that do not split
sequences continues on the same trajectory.

Three launches (one rank, two ranks as one sequence group, the resume): behind `multirun`."""

from __future__ import annotations

import pytest

from tests.distributed.harness import Run, Staged, train

# One row a micro-batch (Ulysses' shape), 4 rows a step read by every layout, no dropout: the trajectory depends on
# the seed, the step and the global batch alone.
SAME_BATCH = [
    "launch.nnodes=1",
    "train.max_steps=4",
    "train.save_steps=2",
    "train.micro_batch_size=1",
    "train.global_batch_size=4",
    "train.lora.dropout=0",
    "eval.final_eval_rows=6",
]


SPLIT = ["launch.nproc_per_node=2", "train.sequence_parallel_size=2"]


@pytest.mark.multirun  # three launches: about 45 s on an idle machine
def test_two_ranks_splitting_each_sequence_reproduce_one_rank(staged: Staged) -> None:
    one = train(staged, "sp-one-rank", [*SAME_BATCH, "launch.nproc_per_node=1"])
    split = train(staged, "sp-two-ranks", [*SAME_BATCH, *SPLIT])

    steps = [record for record in split.metrics() if "event" not in record]
    assert [r["target_tokens"] for r in steps] == [r["target_tokens"] for r in one.metrics() if "event" not in r], (
        "the sequence group must count each target token once"
    )
    assert split.losses() == pytest.approx(one.losses(), rel=2e-5, abs=1e-6)
    assert len(split.losses()) == 4
    # The split run's checkpoint resumed by its two ranks without splitting sequences: another sequence-parallel
    # size continues on the same trajectory. (Another world size with sequence parallelism is refused:
    # trainer/checkpointing/reshard.py.)
    resumed = train(
        staged, "sp-resumed", [*SAME_BATCH, "launch.nproc_per_node=2", f"train.resume={split.checkpoint(2)}"]
    )
    assert resumed.losses() == pytest.approx(one.losses()[2:], rel=2e-5, abs=1e-6)

    final_one, final_split = (final_eval(run) for run in (one, split))
    assert final_split["loss"] == pytest.approx(final_one["loss"], rel=2e-5)
    assert final_split["target_tokens"] == final_one["target_tokens"]
    assert final_split["examples"] == final_one["examples"] == 6


def final_eval(run: Run) -> dict:
    return next(record for record in run.metrics() if record.get("event") == "final_eval")
