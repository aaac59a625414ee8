"""Preflight's `space` check: what the run will write (config/footprint.py) against the free space where it writes,
on run.storage and on this node's own disk, before a rank starts. A shortfall stops the job in one line (a
StorageFull, exit 2) unless launch.require_space is false, which makes it a warning.

Where the bytes go: run.storage holds the kept checkpoints, the export and the merged export (a store that reports
no free space, an object store, is not checked); this node's disk holds, when run.storage is not local, each of its
ranks' share of a checkpoint staged before upload (and on node 0 the export staged before it is published), and the
node cache's copy of a dataset stored remotely. Places on one filesystem are summed.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass

from config.footprint import MODEL_CONFIG, Footprint, estimate, read_model_json, staged_on_node
from launch.job import NodePlan
from storage.fs import read_json
from storage.full import StorageFull, free_bytes, human_bytes, storage_root
from storage.location import Location, is_local, join
from storage.node_cache import cache_root
from storage.spec import Spec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Need:
    """Bytes the run will write in one place, and what they are."""

    place: Location  # a local directory, or the run's directory
    bytes: int
    what: str


def run_footprint(spec: Spec, *, bf16: bool) -> Footprint | None:
    """The run's footprint from this node's copy of the base model's config.json (None: no estimate)."""
    model = read_model_json(spec.model_path)
    return None if model is None else estimate(spec.config, model, spec.total_steps, spec.world_size, bf16=bf16)


def needs(spec: Spec, plan: NodePlan, footprint: Footprint) -> list[Need]:
    """What this node's part of the run writes, by place."""
    out = [
        Need(
            spec.run,
            footprint.storage,
            f"{footprint.checkpoints_kept} checkpoint(s) of {human_bytes(footprint.checkpoint)}"
            f" + export {human_bytes(footprint.export)}"
            + (f" + merged export {human_bytes(footprint.merged)}" if footprint.merged else ""),
        )
    ]
    if not is_local(spec.run):
        staged = staged_on_node(footprint, plan.nproc_per_node, spec.world_size, node0=plan.node_rank == 0)
        out.append(
            Need(Location(tempfile.gettempdir()), staged, "this node's ranks' checkpoint shards staged before upload")
        )
    if not is_local(spec.dataset_dir):
        out.append(
            Need(
                Location(str(cache_root(spec.config.launch.node_cache_dir))),
                dataset_bytes(spec),
                "the dataset's node copy",
            )
        )
    return out


def dataset_bytes(spec: Spec) -> int:
    """Bytes of the staged dataset's files (its manifest), 0 when unreadable here (the dataset check reports it)."""
    try:
        manifest = read_json(join(spec.dataset_dir, "manifest.json"))
    except Exception:  # noqa: BLE001 - the dataset check that follows names the problem
        return 0
    return int(sum(entry["size"] for entry in manifest.get("files", [])))


def device_of(place: Location) -> str:
    """A key per filesystem: the mount point of a local place, the store of a remote one."""
    return storage_root(place)


def check_space(spec: Spec, plan: NodePlan, *, bf16: bool) -> str:
    """Free space against the run's needs on each filesystem it writes to; raise StorageFull (or warn, with
    launch.require_space false) naming the place, the free and the needed bytes."""
    footprint = run_footprint(spec, bf16=bf16)
    if footprint is None:
        return f"no estimate ({spec.model_path}/{MODEL_CONFIG} is not a shape config/footprint.py knows)"
    by_device: dict[str, list[Need]] = {}
    for need in needs(spec, plan, footprint):
        by_device.setdefault(device_of(need.place), []).append(need)
    report = []
    for device, group in by_device.items():
        free = free_bytes(group[0].place)
        needed = sum(need.bytes for need in group)
        what = "; ".join(need.what for need in group)
        if free is None:
            report.append(f"{device}: free space not reported, {human_bytes(needed)} to write")
            continue
        report.append(f"{device}: {human_bytes(free)} free, {human_bytes(needed)} needed")
        if free < needed:
            message = (
                f"node {plan.node_rank}: not enough space on {device}: {human_bytes(free)} free, "
                f"{human_bytes(needed)} needed ({what}); free space there, lower train.keep_latest_k, or point "
                "run.storage at a larger store; launch.require_space=false trains anyway"
            )
            if spec.config.launch.require_space:
                raise StorageFull(message)
            log.warning("%s", message)
            report[-1] += " (short: launch.require_space=false)"
    return "; ".join(report)
