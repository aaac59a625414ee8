"""Straggler detection on two real gloo ranks: every Nth step each rank's mean compute time is gathered, and a rank
slower than the factor times the (lower) median is flagged, in the same list on every rank; a process's first step is
warm-up and not counted."""

from __future__ import annotations

from tests.gloo import on_ranks
from trainer.parallel.distributed import Dist
from trainer.watch.straggler import StragglerWatch


def watch_steps(dist: Dist, per_rank: list[list[float]]) -> list[list[dict]]:
    """Rank r observes per_rank[r] compute times, one a step from step 1, checking at every step."""
    watch = StragglerWatch(every=2, factor=1.5, dist=dist)
    found = []
    for step, seconds in enumerate(per_rank[dist.rank], start=1):
        watch.observe(seconds)
        found.append(watch.check(step))
    return found


def test_the_slow_rank_is_flagged_on_every_rank_and_warm_up_is_not_counted() -> None:
    # Rank 1's first step is slow (warm-up, ignored), then it is 3x rank 0 from step 3 on.
    times = [[0.1, 0.1, 0.1, 0.1], [5.0, 0.1, 0.3, 0.3]]
    rank0, rank1 = on_ranks(watch_steps, 2, times)
    assert rank0 == rank1  # the same answer on every rank
    assert [len(events) for events in rank0] == [0, 0, 0, 1]  # checks at steps 2 and 4 only
    [event] = rank0[3]
    assert (event["event"], event["step"], event["rank"]) == ("straggler", 4, 1)
    assert (
        round(event["compute_s"], 3) == 0.3 and round(event["median_s"], 3) == 0.1 and round(event["ratio"], 1) == 3.0
    )
