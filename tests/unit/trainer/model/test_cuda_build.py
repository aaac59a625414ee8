"""TORCH_CUDA_ARCH_LIST as DeepSpeed's JIT builder can parse it (trainer/model/cuda_build.py)."""

from __future__ import annotations

import pytest

from trainer.model.cuda_build import ARCH_LIST, plain_arch_list


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("9.0a", "9.0"),
        ("8.0 8.6 9.0a+PTX", "8.0;8.6;9.0+PTX"),
        ("9.0;9.0a;10.0f", "9.0;10.0"),
    ],
)
def test_suffixes_are_dropped_for_deepspeed(given: str, expected: str) -> None:
    environ = {ARCH_LIST: given}
    assert plain_arch_list(environ) == expected
    assert environ[ARCH_LIST] == expected
    # What DeepSpeed 0.19's builder does with the list (op_builder/builder.py, compute_capability_args):
    sorted(expected.split(";"), key=lambda cc: tuple(int(part.split("+")[0]) for part in cc.split(".")))


@pytest.mark.parametrize("given", [None, "", "8.0;9.0+PTX"])
def test_a_list_deepspeed_parses_is_left_alone(given: str | None) -> None:
    environ = {} if given is None else {ARCH_LIST: given}
    assert plain_arch_list(environ) is None
    assert environ == ({} if given is None else {ARCH_LIST: given})
