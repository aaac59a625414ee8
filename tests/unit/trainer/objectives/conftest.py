"""The objectives' pinned model and fixed SFT rows (pinned.py), built once for the session."""

from __future__ import annotations

from typing import Any

import pytest

from storage.shards import Row
from tests.unit.trainer.objectives.pinned import build, supervised_rows


@pytest.fixture(scope="session")
def pinned_model() -> Any:
    return build()


@pytest.fixture(scope="session")
def pinned_rows(pinned_model: Any) -> list[Row]:
    return supervised_rows(pinned_model)
