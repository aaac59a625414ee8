"""The one place that talks to the process group, on two real gloo ranks: sums in float64 on every rank, objects
gathered in rank order, tensors gathered to rank 0 only, a second group for a background thread, and the timings the
network probe takes; without a group (one rank) each is the identity."""

from __future__ import annotations

import torch

from tests.gloo import on_ranks
from trainer.parallel.distributed import (
    Dist,
    dist_sum,
    gather_objects,
    gather_to_main,
    side_group,
    timed_all_reduce,
    timed_exchange,
)


def collectives(dist: Dist) -> dict:
    gathered = gather_to_main(torch.full((3,), float(dist.rank + 1)), dist)
    group = side_group(dist)
    return {
        "rank": (dist.rank, dist.world_size, dist.node_rank, dist.is_main),
        "sum": dist_sum([0.1 * (dist.rank + 1), 1e16 if dist.rank == 0 else 1.0], dist),
        "objects": gather_objects({"rank": dist.rank}, dist),
        "on_side_group": gather_objects(dist.rank * 10, dist, group),
        "to_main": None if gathered is None else [t.tolist() for t in gathered],
        "all_reduce_s": timed_all_reduce(1 << 16, dist),
        "exchange": timed_exchange(1, 1 << 16, dist),
    }


def test_collectives_on_two_ranks() -> None:
    rank0, rank1 = on_ranks(collectives, 2)
    assert rank0["rank"] == (0, 2, 0, True) and rank1["rank"] == (1, 2, 0, False)  # both ranks on node 0
    assert rank0["sum"] == rank1["sum"] == [0.1 + 0.2, 1e16 + 1.0]  # float64: the 1.0 survives
    assert rank0["objects"] == rank1["objects"] == [{"rank": 0}, {"rank": 1}]
    assert rank0["on_side_group"] == rank1["on_side_group"] == [0, 10]
    assert rank0["to_main"] == [[1.0] * 3, [2.0] * 3] and rank1["to_main"] is None
    assert rank0["all_reduce_s"] > 0 and rank1["all_reduce_s"] > 0
    to_peer, back = rank0["exchange"]
    assert to_peer > 0 and back > 0 and rank1["exchange"] is None


def test_without_a_group_each_is_the_identity() -> None:
    one = Dist(0, 0, 1, 0, "host", torch.device("cpu"))
    assert dist_sum([1.5, 2.0], one) == [1.5, 2.0]
    assert gather_objects("x", one) == ["x"] and side_group(one) is None
    [alone] = gather_to_main(torch.ones(2), one)
    assert alone.tolist() == [1.0, 1.0]
