"""The pipeline's liveness record (launch/liveness.py) on a real directory: a node's watch stays quiet while the
pipeline renews it, stops the node once it is unchanged or removed for the stale time, counts an unreadable record
as renewed (an outage is not the pipeline's death), and follows no record left long before it started. The renewal
interval is shortened (monkeypatch) so the test takes seconds, not the production 2 s x 15 s."""

from __future__ import annotations

import json
import os
import time

import pytest

from launch import liveness
from launch.liveness import PipelineBeat, PipelineGone, PipelineWatch, record_url
from storage.location import Location


@pytest.fixture
def run_url(tmp_path, monkeypatch) -> Location:
    monkeypatch.setattr(liveness, "RENEW_S", 0.05)
    return Location(str(tmp_path / "run"))


def watch_for(watch: PipelineWatch, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        watch.poll()
        time.sleep(0.02)


def test_a_renewed_record_keeps_the_node_and_a_stale_one_stops_it(run_url) -> None:
    beat = PipelineBeat(run_url)
    with beat.hold():
        watch = PipelineWatch(run_url, stale_s=0.5)
        assert watch.following
        watch_for(watch, 1.0)  # renewed every 0.05 s: no stop
        beat._stop.set()  # the pipeline "dies": no more renewals (the file stays, as after kill -9)
        time.sleep(0.1)
        with pytest.raises(PipelineGone, match="unchanged for"):
            watch_for(watch, 2.0)
    assert not os.path.exists(str(record_url(run_url)))  # a phase that ends removes it


def test_an_unreadable_record_counts_as_renewed(run_url) -> None:
    with PipelineBeat(run_url).hold():
        watch = PipelineWatch(run_url, stale_s=0.3)
    path = str(record_url(run_url))
    os.makedirs(path)  # the record cannot be read (a directory where the file was): every read raises
    watch_for(watch, 1.0)  # never taken for the pipeline's death


def test_a_removed_record_stops_the_node(run_url) -> None:
    with PipelineBeat(run_url).hold():
        watch = PipelineWatch(run_url, stale_s=0.3)
    with pytest.raises(PipelineGone, match="removed for"):
        watch_for(watch, 2.0)


def test_no_record_or_an_old_one_is_not_followed(run_url) -> None:
    assert not PipelineWatch(run_url).following  # a node started by hand, no pipeline
    path = str(record_url(run_url))
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as handle:
        json.dump({"token": "t", "beat": 9, "renewed_at": time.time() - 3600}, handle)
    watch = PipelineWatch(run_url, stale_s=0.1)
    assert not watch.following  # an earlier pipeline's, dead long before this node started
    watch_for(watch, 0.5)
