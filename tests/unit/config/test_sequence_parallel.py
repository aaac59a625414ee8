"""Sequence parallelism's layout and refusals: groups inside a node where they fit, across whole nodes otherwise,
data parallelism across them; a size that does not divide the world, the ranks per node or the heads refused in one
line naming the numbers and the fix; the config counting sequence groups, not ranks, in the global batch."""

from __future__ import annotations

import pytest

from config.loader import load_config
from config.sequence_parallel import Layout, heads_problem, kv_replication, layout_problem
from core.errors import UserError


def test_groups_stay_inside_a_node_and_data_parallelism_goes_across() -> None:
    layout = Layout(world=8, per_node=4, size=2)  # 2 nodes x 4 ranks
    assert layout.sequence_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.data_parallel_groups() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert layout.data_parallel == 4
    assert [layout.data_parallel_rank(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [layout.sequence_rank(r) for r in range(8)] == [0, 1] * 4
    text = layout.describe()
    assert "4 data-parallel x 2 sequence-parallel" in text and "inside a node" in text
    assert "[0,1] [2,3] [4,5] [6,7]" in text and "[0,2,4,6] [1,3,5,7]" in text


def test_a_group_larger_than_a_node_spans_whole_nodes() -> None:
    layout = Layout(world=8, per_node=2, size=4)
    assert layout.sequence_groups() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert "across 2 nodes" in layout.describe()
    assert layout_problem(4, 8, 2) is None


def test_layout_refusals_name_the_numbers_and_the_fix() -> None:
    assert layout_problem(1, 3, 3) is None
    assert layout_problem(4, 6, 6) == (
        "train.sequence_parallel_size=4 does not divide the 6 ranks (launch.nnodes x launch.nproc_per_node); "
        "use a divisor of 6 (1, 2, 3, 6)"
    )
    problem = layout_problem(3, 12, 2)  # divides the world, but groups would straddle nodes
    assert problem is not None and "straddle" in problem and "use one of 1, 2" in problem


def test_heads_refusals_and_key_value_replication() -> None:
    assert heads_problem(2, 14, 2) is None  # Qwen2.5-0.5B: 14 heads, 2 key-value heads
    assert heads_problem(2, 2, 1) is None and kv_replication(2, 1) == 2  # one key-value head, replicated twice
    assert kv_replication(8, 4) == 2 and kv_replication(2, 4) == 1
    assert heads_problem(4, 14, 2) == (
        "train.sequence_parallel_size=4 does not divide the model's 14 attention heads (Ulysses gives each rank "
        "whole heads); use one of 1, 2, 7, 14"
    )
    problem = heads_problem(4, 12, 6)
    assert problem is not None and "6 key-value heads" in problem and "replicates" in problem


def test_the_config_counts_sequence_groups_in_the_global_batch() -> None:
    cfg = load_config(
        None,
        ["launch.nproc_per_node=4", "train.sequence_parallel_size=2", "train.micro_batch_size=1",
         "train.global_batch_size=8"],
    )  # fmt: skip
    assert cfg.readers(4) == 2
    assert cfg.accumulation_steps(4) == 4 and cfg.global_batch(4) == 8
    assert cfg.batch_text(4) == "8 rows = 1 x 4 accumulation x 2 sequence groups of 2 ranks"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["launch.nnodes=1", "launch.nproc_per_node=3", "train.sequence_parallel_size=2"],
         "does not divide the 3 ranks"),
        (["launch.nproc_per_node=2", "train.sequence_parallel_size=2", "train.micro_batch_size=2"],
         "needs train.micro_batch_size=1"),
        (["launch.nproc_per_node=2", "train.sequence_parallel_size=2", "train.micro_batch_size=1",
          "train.objective=dpo"], "train.objective=dpo is not split across ranks yet"),
        (["launch.nproc_per_node=2", "train.sequence_parallel_size=2", "train.micro_batch_size=1",
          "data.packing=true"], "set data.packing=false"),
    ],
)  # fmt: skip
def test_config_refusals(overrides: list[str], message: str) -> None:
    with pytest.raises(UserError, match=message):
        load_config(None, overrides)
