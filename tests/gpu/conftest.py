"""The `gpu` suite: real CUDA, NCCL and bitsandbytes' 4-bit path. Skipped, with the reason, where no CUDA device
exists (CI has none); run on a GPU machine with `pytest -m gpu tests/gpu` (tests/benchmarks/GPU.md)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device here: the gpu suite runs on a GPU machine (tests/benchmarks/GPU.md)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
