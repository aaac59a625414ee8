"""The network probe, on every rank before the first training step (and alone: `python -m trainer.watch.probe --spec S`,
the `probe` phase): the job's bus bandwidth from one all-reduce of launch.probe_mb MB over every rank, and, because
every rank of an all-reduce sees the same time, a send/receive between node 0 and each other node, both ways, to
name the slow one. Also every node must show the same GPUs. The figures go to the log and to each node's
preflight.json; below launch.min_bandwidth_gbps the probe warns, or fails with launch.require_bandwidth.

    torchrun --nnodes N --nproc-per-node P --node-rank R --master-addr A --master-port PORT \
        -m trainer.watch.probe --spec {storage}/runs/{run_id}/spec.json
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Any

import torch

from core.errors import UserError
from storage import layout
from storage.fs import exists, read_json, write_json_atomic
from storage.location import ARGUMENT_FORM, Location, join, location_argument
from storage.spec import Spec
from trainer.parallel.distributed import Dist, gather_objects, timed_all_reduce, timed_exchange

log = logging.getLogger(__name__)


def gpu_description() -> str:
    """This node's GPUs as the probe compares them: 'N x MODEL', or 'no GPU'."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return f"{count} x {torch.cuda.get_device_name(0)}" if count else "no GPU"


def _gbps(nbytes: int, seconds: float) -> float:
    return round(nbytes * 8 / max(seconds, 1e-9) / 1e9, 3)


def run_probe(spec: Spec, dist: Dist) -> dict[str, Any]:
    """Probe, record in this node's preflight.json (its first rank), log (rank 0); UserError when the GPUs differ
    between nodes, or the bandwidth is too low and launch.require_bandwidth is set (on every rank alike)."""
    launch = spec.config.launch
    started = time.perf_counter()
    me = {
        "node": dist.node_rank,
        "host": dist.host,
        "addr": os.environ.get(layout.NODE_ADDR_ENV, ""),
        "gpus": gpu_description(),
    }
    nodes = gather_objects(me, dist)[:: launch.nproc_per_node]  # each node's first rank
    report: dict[str, Any] = {"gpus across nodes": _same_gpus(nodes)}
    figures = None
    if launch.probe_mb > 0 and dist.world_size > 1:
        figures = _measure(int(launch.probe_mb * 2**20), launch.nproc_per_node, launch.nnodes, dist, started)
        report["bandwidth"] = figures
    if dist.local_rank == 0:
        _record(spec.run, dist, report)
    if figures is not None:
        verdict = _verdict(figures, nodes, launch.min_bandwidth_gbps)
        if dist.is_main:
            log.info("network probe: %s", _summary(figures, nodes))
        if verdict is not None:
            if launch.require_bandwidth:
                raise UserError(f"{verdict}; or unset launch.require_bandwidth to train anyway")
            if dist.is_main:
                log.warning("%s", verdict)
    return report


def _same_gpus(nodes: list[dict[str, Any]]) -> str:
    """Every node shows the same GPUs; UserError naming the odd node otherwise."""
    kinds = [n["gpus"] for n in nodes]
    common = max(set(kinds), key=kinds.count)
    odd = [n for n in nodes if n["gpus"] != common]
    if odd:
        n = odd[0]
        raise UserError(
            f"node {n['node']} ({n['host']}, {n['addr']}) has {n['gpus']}, the other nodes "
            f"{common}: run the job on nodes with the same GPUs (or exclude that node)"
        )
    return f"{common} on every node ({len(nodes)})"


def _measure(nbytes: int, nproc: int, nnodes: int, dist: Dist, started: float) -> dict[str, Any]:
    """The all-reduce and the pairwise figures, on every rank (rank 0 measures, then shares); `seconds` is what the
    whole probe cost rank 0 since `started`."""
    seconds = timed_all_reduce(nbytes, dist)
    pairs = {}
    for node in range(1, nnodes):
        times = timed_exchange(node * nproc, nbytes, dist)
        if times is not None:
            pairs[node] = {"from_node0_gbps": _gbps(nbytes, times[0]), "to_node0_gbps": _gbps(nbytes, times[1])}
    world = dist.world_size
    mine = {
        "probe_mb": round(nbytes / 2**20, 3),
        "ranks": world,
        "allreduce_s": round(seconds, 4),
        "bus_gbps": round(_gbps(nbytes, seconds) * 2 * (world - 1) / world, 3),
        "nodes": pairs,
        "seconds": round(time.perf_counter() - started, 3),
    }
    shared = gather_objects(mine if dist.rank == 0 else None, dist)[0]
    slowest = min(shared["nodes"].items(), key=lambda kv: min(kv[1].values()), default=None)
    if slowest is not None:
        shared["slowest_node"] = int(slowest[0])
    return shared


def _verdict(figures: dict[str, Any], nodes: list[dict[str, Any]], minimum: float) -> str | None:
    """The complaint when a figure is below the minimum: the slowest node's link, else the whole job's."""
    slow = [(min(f.values()), int(node), f) for node, f in figures["nodes"].items() if min(f.values()) < minimum]
    if slow:
        _, node, f = min(slow)
        n = nodes[node]
        return (
            f"network probe: node {node} ({n['host']}, {n['addr']}) is slow: {f['from_node0_gbps']} Gbit/s from "
            f"node 0, {f['to_node0_gbps']} Gbit/s to node 0, below launch.min_bandwidth_gbps={minimum}; check its "
            "link and interface (iperf3 between it and node 0)"
        )
    if figures["bus_gbps"] < minimum:
        return (
            f"network probe: all-reduce bus bandwidth {figures['bus_gbps']} Gbit/s over {figures['ranks']} ranks, "
            f"below launch.min_bandwidth_gbps={minimum}; check the nodes' links and interfaces"
        )
    return None


def _summary(figures: dict[str, Any], nodes: list[dict[str, Any]]) -> str:
    pairs = "; ".join(
        f"node {node} ({nodes[int(node)]['addr'] or nodes[int(node)]['host']}) from/to node 0 "
        f"{f['from_node0_gbps']}/{f['to_node0_gbps']} Gbit/s"
        for node, f in figures["nodes"].items()
    )
    return (
        f"all-reduce of {figures['probe_mb']} MB over {figures['ranks']} ranks in {figures['allreduce_s']} s, "
        f"bus bandwidth {figures['bus_gbps']} Gbit/s"
        + (f"; {pairs}" if pairs else "")
        + f"; probe took {figures['seconds']} s"
    )


def _record(run_url: Location, dist: Dist, report: dict[str, Any]) -> None:
    """Add the probe's findings to this node's preflight.json (written by the launcher's preflight)."""
    url = join(layout.node_dir(run_url, dist.node_rank), layout.PREFLIGHT)
    doc: dict[str, Any] = (
        read_json(url) if exists(url) else {"node_rank": dist.node_rank, "host": dist.host, "checks": {}}
    )
    doc["checks"].update(report)
    write_json_atomic(url, doc)


def main(argv: list[str] | None = None) -> int:
    """Only the probe, on every rank of a torchrun job."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer.watch.probe", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spec", required=True, type=location_argument, help=f"the run's spec.json: {ARGUMENT_FORM}")
    args = parser.parse_args(argv)
    from trainer.harness import run_rank

    return run_rank(args.spec, lambda spec, dist, _faults: run_probe(spec, dist), deepspeed_backend=False)


if __name__ == "__main__":
    from trainer.harness import exit_now

    exit_now(main())
