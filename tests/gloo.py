"""A function run on a few real gloo ranks, each a fresh process joining the process group as a torchrun rank does
(trainer/parallel/distributed.py `init`), for the unit tests of what is collective: each rank's return value comes
back."""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launch.command import free_port

COLLECTIVE_TIMEOUT_S = 60


def on_ranks(fn: Callable[..., Any], world: int, *args: Any, per_node: int | None = None) -> list[Any]:
    """fn(dist, *args) on `world` ranks, `per_node` ranks a node (default: all on one); every rank's result, in rank
    order (fn: a module-level function, so that the spawned processes import it)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="tandem-gloo-") as folder:
        spawned = (world, per_node or world, free_port(), folder, fn, args)
        mp.spawn(_rank, args=spawned, nprocs=world, join=True)
        return [pickle.loads((Path(folder) / f"rank-{rank}.pkl").read_bytes()) for rank in range(world)]


def _rank(
    rank: int, world: int, per_node: int, port: int, folder: str, fn: Callable[..., Any], args: tuple[Any, ...]
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    os.environ.update(LOCAL_RANK=str(rank % per_node), LOCAL_WORLD_SIZE=str(per_node), OMP_NUM_THREADS="1")
    from trainer.parallel.distributed import init, shutdown

    dist = init(deepspeed_backend=False, timeout_s=COLLECTIVE_TIMEOUT_S)
    try:
        result = fn(dist, *args)
    finally:
        shutdown()
    (Path(folder) / f"rank-{rank}.pkl").write_bytes(pickle.dumps(result))
