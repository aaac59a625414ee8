"""The ranks' environment: the defaults Tandem adds, and a node's own settings kept over them."""

from __future__ import annotations

import pytest

from config.sections.launch import LaunchConfig
from launch.command import MALLOC_MMAP_THRESHOLD, rank_environment
from storage.fs import Location


def test_ranks_get_a_fixed_malloc_threshold_unless_the_node_sets_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """glibc's dynamic threshold kept freed layer-sized blocks in the heap (docs/large-models.md measures it): the
    ranks get a fixed one, and a node that tunes its allocator keeps its own value."""
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    env = rank_environment(LaunchConfig(), Location("/tmp/run"))
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(MALLOC_MMAP_THRESHOLD) == "1048576"
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert rank_environment(LaunchConfig(), Location("/tmp/run"))["MALLOC_MMAP_THRESHOLD_"] == "131072"
