"""Sequence parallelism (train.sequence_parallel_size) through the real trainer: DeepSpeed's Ulysses on 2 gloo ranks of
one node splitting every row in two reproduces one rank's step losses, target tokens and final evaluation at the
same global batch (float rounding apart), as do 4 ranks on 2 nodes as 2 x 2 under ZeRO-3 (with train.tiled_mlp),
and the split run's checkpoint resumed by two ranks that do not split sequences continues on the same trajectory,
while one rank at size 1 (another world size) is refused in one line.

Five launches (one rank, two ranks as one sequence group, four as two, the refusal, the resume): behind `multirun`."""

from __future__ import annotations

import json

import pytest

from core.errors import UserError
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
ZERO3 = "deepspeed.config=config/deepspeed/zero3.json"


@pytest.mark.multirun  # five launches (one refused at start): 51 s on an idle machine
def test_two_ranks_splitting_each_sequence_reproduce_one_rank(staged: Staged) -> None:
    one = train(staged, "sp-one-rank", [*SAME_BATCH, "launch.nproc_per_node=1"])
    split = train(staged, "sp-two-ranks", [*SAME_BATCH, *SPLIT])

    steps = [record for record in split.metrics() if "event" not in record]
    assert [r["target_tokens"] for r in steps] == [r["target_tokens"] for r in one.metrics() if "event" not in r], (
        "the sequence group must count each target token once"
    )
    assert split.losses() == pytest.approx(one.losses(), rel=2e-5, abs=1e-6)
    assert len(split.losses()) == 4
    # Four ranks on two nodes as 2 data-parallel x 2 sequence-parallel groups, LoRA under ZeRO-3: each data-parallel
    # rank reads half of the global batch, its sequence group splits every row, and the trajectory is one rank's.
    # With train.tiled_mlp: its partitioned MLP weights fetched the same number of times on every rank (the ranks
    # agree on the tile count), and the adapters' gradients reduced once, after the last tile.
    grid = train(staged, "sp-2x2-zero3", [*SAME_BATCH, *SPLIT, "launch.nnodes=2", ZERO3, "train.tiled_mlp=true"])
    assert [r["target_tokens"] for r in grid.metrics() if "event" not in r] == [r["target_tokens"] for r in steps]
    assert grid.losses() == pytest.approx(one.losses(), rel=2e-5, abs=1e-6)
    grid_log = (grid.run_dir / "nodes" / "0" / "log.txt").read_text()
    assert "2 data-parallel x 2 sequence-parallel; sequence groups (inside a node) [0,1] [2,3]; " in grid_log
    assert "data-parallel groups [0,2] [1,3]" in grid_log
    assert "train.tiled_mlp: 2 dense MLPs computed in tiles" in grid_log
    # The checkpoint records the layout it was written at; on another world size (one rank, size 1) it is refused
    # at start, before DeepSpeed's conversion (which cannot merge sequence groups) runs.
    manifest = json.loads((split.checkpoint(2) / "manifest.json").read_text())
    assert (manifest["world_size"], manifest["sequence_parallel_size"]) == (2, 2)
    with pytest.raises(UserError, match=r"written by 2 ranks at train\.sequence_parallel_size=2 and this run has 1 "):
        train(staged, "sp-other-world", [*SAME_BATCH, "launch.nproc_per_node=1", f"train.resume={split.checkpoint(2)}"])
    assert not (split.checkpoint(2) / "universal").exists()
    # The split run's checkpoint resumed by its two ranks without splitting sequences: another sequence-parallel
    # size continues on the same trajectory.
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
