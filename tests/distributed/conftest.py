"""Fixtures for tests that run real torchrun ranks."""

from __future__ import annotations

import pytest

from tests.distributed.harness import Staged, stage


@pytest.fixture(scope="session")
def staged(tmp_path_factory) -> Staged:
    """The tiny model and sample data, staged once for every distributed test."""
    return stage(tmp_path_factory.mktemp("dist-storage"))
