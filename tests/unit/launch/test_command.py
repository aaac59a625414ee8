"""What runs on a node (launch/command.py): the ranks' environment is a value built from this process's environment
without changing it (the local backend's nodes are threads of one process: a change made for one node would reach
the others), the job's own variables reach it, launch.env wins over them, and a description never shows a forwarded
credential's value."""

from __future__ import annotations

import os

import pytest

from config.sections.launch import LaunchConfig
from launch.command import (
    MALLOC_MMAP_THRESHOLD,
    TRANSPORT_DEBUG,
    environment_lines,
    node_environment,
    rank_environment,
    transport_debug_env,
)
from storage import layout


def test_a_retrys_transport_levels_leave_a_level_the_user_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TRANSPORT_DEBUG:
        monkeypatch.delenv(name, raising=False)
    assert transport_debug_env() == TRANSPORT_DEBUG
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    levels = transport_debug_env()
    assert "NCCL_DEBUG" not in levels and levels["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert node_environment(LaunchConfig(), levels)["NCCL_DEBUG"] == "WARN"  # forwarded


def test_the_ranks_environment_is_a_value_and_this_process_is_left_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    before = dict(os.environ)
    launch = LaunchConfig(env={"TANDEM_X": "from launch.env"})
    one = rank_environment(launch, extra={"NCCL_DEBUG": "INFO", "TANDEM_X": "job"})
    other = rank_environment(launch)
    assert dict(os.environ) == before
    assert one["NCCL_DEBUG"] == "INFO" and "NCCL_DEBUG" not in other  # one node's job does not leak into another's
    assert one["TANDEM_X"] == other["TANDEM_X"] == "from launch.env"


def test_a_description_masks_the_forwarded_names_values() -> None:
    launch = LaunchConfig(forward_env=["HF_TOKEN"])
    lines = environment_lines({"HF_TOKEN": "hf_secret", "B": "two words", "A": "1"}, launch)
    assert lines == ["A=1", "B='two words'", "HF_TOKEN=***"]


def test_ranks_get_a_fixed_malloc_threshold_unless_the_node_sets_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """glibc's dynamic threshold kept freed layer-sized blocks in the heap (docs/large-models.md measures it): the
    ranks get a fixed one, and a node that tunes its allocator keeps its own value."""
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    env = rank_environment(LaunchConfig())
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(MALLOC_MMAP_THRESHOLD) == "1048576"
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert rank_environment(LaunchConfig())["MALLOC_MMAP_THRESHOLD_"] == "131072"


def test_ranks_are_told_they_are_ranks() -> None:
    """The trainer package keeps MLflow out of a rank's start on this variable (tests/unit/trainer/test_init.py)."""
    assert rank_environment(LaunchConfig())[layout.RANK_PROCESS_ENV] == "1"
