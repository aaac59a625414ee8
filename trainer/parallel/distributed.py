"""Everything about process groups, in one place: rank identity, init/teardown, and reductions.

The rest of the trainer receives a `Dist` and calls `dist_sum`/`gather_objects`/`gather_to_main`/`barrier`; nothing
else reads RANK/LOCAL_RANK/WORLD_SIZE or calls torch.distributed.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist

from config.sequence_parallel import Layout


@dataclass(frozen=True)
class Dist:
    """This rank's place in the job."""

    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    host: str
    device: torch.device
    local_world: int = 1  # ranks on this node
    sequence_parallel: int = 1  # train.sequence_parallel_size: ranks that split one sequence
    averaged_by: int | None = None  # the ranks DeepSpeed divides a gradient by, where not data_world

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the one that writes shared files."""
        return self.rank == 0

    @property
    def layout(self) -> Layout:
        """The job's ranks as sequence groups x data-parallel groups (config/sequence_parallel.py)."""
        return Layout(self.world_size, self.local_world, self.sequence_parallel)

    @property
    def data_rank(self) -> int:
        """This rank's place among the ranks that read different rows (its sequence group's)."""
        return self.layout.data_parallel_rank(self.rank)

    @property
    def data_world(self) -> int:
        """Ranks that read different rows: one per sequence group (all ranks without sequence parallelism)."""
        return self.layout.data_parallel

    @property
    def gradient_ranks(self) -> int:
        """The ranks DeepSpeed divides a summed gradient by, which an objective's loss scale undoes: data_world, except
        under ZeRO-3 with sequence parallelism (trainer/parallel/sequence_parallel.py `gradient_divisor`)."""
        return self.averaged_by or self.data_world


def init(*, deepspeed_backend: bool, timeout_s: int = 300, connect_timeout_s: int | None = None) -> Dist:
    """Join the process group torchrun set up (gloo on CPU, NCCL on GPU) and describe this rank.

    Connecting to the peers gets `connect_timeout_s` (the rendezvous timeout): a rank whose peers never connect
    (a wrong interface, a firewall, a peer that died) stops then, not after the collective timeout of up to hours;
    the collectives after it get `timeout_s`."""
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if "MASTER_ADDR" not in os.environ:  # a plain `python -m trainer` run: a group of one
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
        )
    timeout = datetime.timedelta(seconds=timeout_s)
    connect = datetime.timedelta(seconds=min(timeout_s, connect_timeout_s or timeout_s))
    if deepspeed_backend:
        import deepspeed

        deepspeed.init_distributed(dist_backend=backend, timeout=connect)
    else:
        tdist.init_process_group(backend=backend, timeout=connect)
    if connect != timeout and tdist.is_initialized():
        from torch.distributed.distributed_c10d import _set_pg_timeout

        _set_pg_timeout(timeout)
    return Dist(rank, local_rank, world_size, rank // local_world, socket.gethostname(), device, local_world)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def dist_sum(values: Sequence[float], dist: Dist) -> list[float]:
    """Element-wise SUM over all ranks, in float64 (sum numerators and denominators, divide once)."""
    tensor = torch.tensor(list(values), dtype=torch.float64, device=dist.device)
    if tdist.is_initialized() and dist.world_size > 1:
        tdist.all_reduce(tensor, op=tdist.ReduceOp.SUM)
    return tensor.tolist()


def gather_objects(obj: Any, dist: Dist, group: Any = None) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank (over `group`: the default group, or one of side_group's)."""
    if not tdist.is_initialized() or dist.world_size == 1:
        return [obj]
    out: list[Any] = [None] * dist.world_size
    tdist.all_gather_object(out, obj, group=group)
    return out


def gather_to_main(
    tensor: torch.Tensor, dist: Dist, into: list[torch.Tensor] | None = None
) -> list[torch.Tensor] | None:
    """Every rank's `tensor` (one shape and dtype on every rank) on rank 0, in rank order; None on the other ranks.
    Unlike gather_objects nothing is pickled and only rank 0 receives: numbers too many to copy to every rank as
    Python objects (a reference table's rows) go this way, in blocks of a fixed size. `into`: rank 0's tensors to
    receive in (one per rank, on dist.device), for a caller that gathers many times: new ones each time fragment the
    heap, which then grows with the number of gathers."""
    if not tdist.is_initialized() or dist.world_size == 1:
        return [tensor]
    tensor = tensor.to(dist.device)  # NCCL gathers on the device, gloo on the CPU
    if dist.is_main and into is None:
        into = [torch.empty_like(tensor) for _ in range(dist.world_size)]
    tdist.gather(tensor, into if dist.is_main else None, dst=0)
    return into if dist.is_main else None


def side_group(dist: Dist) -> Any:
    """A second gloo group over every rank, for collectives that a background thread runs while the main thread
    trains: two threads must never share a group, or their collectives interleave. Collective: every rank calls it,
    in the same order. None when there is nothing to coordinate (one rank)."""
    if not tdist.is_initialized() or dist.world_size == 1:
        return None
    return tdist.new_group(backend="gloo")


def timed_all_reduce(nbytes: int, dist: Dist) -> float:
    """Seconds one SUM all-reduce of `nbytes` (float32) takes over every rank, after a warm-up of the same size (the
    first one pays for buffers and TCP's slow start)."""
    tensor = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=dist.device)
    tdist.all_reduce(tensor)
    _sync(dist)
    started = time.perf_counter()
    tdist.all_reduce(tensor)
    _sync(dist)
    return time.perf_counter() - started


def timed_exchange(peer: int, nbytes: int, dist: Dist) -> tuple[float, float] | None:
    """Between rank 0 and `peer`: seconds to send `nbytes` rank 0 -> peer and peer -> rank 0, each until the
    receiver has it (a one-element answer closes each timing), after one untimed round. Rank 0 gets the times; the
    peer None; other ranks take no part."""
    payload = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=dist.device)
    ack = torch.zeros(1, dtype=torch.float32, device=dist.device)
    if dist.rank == 0:
        tdist.send(payload, peer)
        tdist.recv(payload, peer)
        started = time.perf_counter()
        tdist.send(payload, peer)
        tdist.recv(ack, peer)
        to_peer = time.perf_counter() - started
        started = time.perf_counter()
        tdist.send(ack, peer)
        tdist.recv(payload, peer)
        return to_peer, time.perf_counter() - started
    if dist.rank == peer:
        tdist.recv(payload, 0)
        tdist.send(payload, 0)
        tdist.recv(payload, 0)
        tdist.send(ack, 0)
        tdist.recv(ack, 0)
        tdist.send(payload, 0)
    return None


def _sync(dist: Dist) -> None:
    if dist.device.type == "cuda":
        torch.cuda.synchronize(dist.device)


def barrier() -> None:
    """Wait for every rank."""
    if tdist.is_initialized():
        tdist.barrier()


def shutdown() -> None:
    """Leave the process group cleanly."""
    if tdist.is_initialized():
        tdist.destroy_process_group()
