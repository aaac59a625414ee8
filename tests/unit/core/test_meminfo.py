"""This machine's /proc/meminfo in bytes, as preflight's memory check and the checkpoint snapshot's budget read it."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.meminfo import meminfo


@pytest.mark.skipif(not Path("/proc/meminfo").exists(), reason="needs Linux's /proc/meminfo")
def test_every_field_is_in_bytes_as_the_kernel_counts_them() -> None:
    kernel = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, value = line.split(":", 1)
        kernel[name] = value.split()
    info = meminfo()
    assert set(info) == set(kernel)
    assert info["MemTotal"] == int(kernel["MemTotal"][0]) * 1024  # kB in the file
    unitless = next((name for name, value in kernel.items() if len(value) == 1), None)  # HugePages_Total: a count
    if unitless is not None:
        assert info[unitless] == int(kernel[unitless][0])
    assert 0 < info["MemAvailable"] <= info["MemTotal"]


def test_a_kernel_without_the_file_gives_nothing(monkeypatch) -> None:
    def missing(*_args, **_kwargs):
        raise FileNotFoundError("/proc/meminfo")

    monkeypatch.setattr("builtins.open", missing)
    assert meminfo() == {}
