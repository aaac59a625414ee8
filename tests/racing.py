"""Run a function in several processes at once (spawned, released together by a barrier) and collect results."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from typing import Any


def _worker(fn: Callable[..., Any], args: tuple, barrier: Any, out: Any, index: int, env: dict[str, str]) -> None:
    import os

    os.environ.update(env)
    barrier.wait(timeout=60)
    try:
        out.put((index, True, fn(*args)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the test
        out.put((index, False, f"{type(exc).__name__}: {exc}"))


def race(fn: Callable[..., Any], calls: list[tuple], env: dict[str, str] | None = None, timeout: float = 120) -> list:
    """fn(*args) for every args in `calls`, each in its own process, all started at the same moment."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(len(calls)), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(fn, args, barrier, out, i, env or {})) for i, args in enumerate(calls)]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=timeout) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    failures = [message for _, ok, message in results if not ok]
    assert not failures, failures
    return [value for _, _, value in sorted(results, key=lambda r: r[0])]
