"""Preflight's `memory` check: the run's memory plan (config/memory_plan.py) against what this node has, before a
rank loads anything: the least free GPU's memory (nvidia-smi) for one rank's device peak, and MemAvailable
(/proc/meminfo) for the host peak of this node's ranks. The plan states its own error (PLAN_ERROR): a node is refused
only when even the plan less that error does not fit, in one line naming the largest term and the setting that
shrinks it, unless launch.require_fit is false, which makes it a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from config.footprint import read_model_json
from config.memory_plan import GB, PLAN_ERROR, MemoryPlan, Term, plan
from core.errors import UserError
from core.meminfo import meminfo
from launch.job import NodePlan
from storage.spec import Spec

log = logging.getLogger(__name__)


def run_plan(spec: Spec, *, on_gpu: bool) -> MemoryPlan | None:
    """The run's plan from this node's copy of the base model's config.json (None: no plan)."""
    model = read_model_json(spec.model_path)
    return None if model is None else plan(spec.config, spec.deepspeed, model, on_gpu=on_gpu)


def mem_available() -> int | None:
    """Host memory available to new work (/proc/meminfo's MemAvailable), None where the kernel does not say."""
    return meminfo().get("MemAvailable")


def shortfall(what: str, needed: int, free: int, largest: Term) -> str | None:
    """The one-line reason, when even the plan less its error exceeds what is free."""
    if needed * (1 - PLAN_ERROR) <= free:
        return None
    fix = f"; {largest.shrink} shrinks it" if largest.shrink else ""
    return (
        f"{what}: the plan needs {needed / GB:.1f} GB, {free / GB:.1f} GB free (largest term: {largest.what}, "
        f"{largest.bytes / GB:.1f} GB{fix})"
    )


def check_fit(
    spec: Spec,
    node: NodePlan,
    *,
    gpu_free_bytes: int | None,
    available: Callable[[], int | None] = mem_available,
) -> str:
    """Raise UserError (or warn, with launch.require_fit false) when the plan does not fit this node;
    `gpu_free_bytes`: the least free GPU's free memory, None on a node without GPUs (CPU ranks); `available`: the
    host memory available (MemAvailable)."""
    on_gpu = gpu_free_bytes is not None
    memory = run_plan(spec, on_gpu=on_gpu)
    if memory is None:
        return f"no plan ({spec.model_path}/config.json is not a shape config/memory_plan.py knows)"
    problems: list[str | None] = []
    report = []
    if gpu_free_bytes is not None:
        report.append(f"{memory.device_bytes / GB:.1f} GB a GPU, {gpu_free_bytes / GB:.1f} GB free")
        problems.append(shortfall("GPU memory", memory.device_bytes, gpu_free_bytes, memory.largest(memory.device)))
    host_free = available()
    host_terms = memory.host + ([] if on_gpu else memory.device)
    ranks = f"{node.nproc_per_node} rank{'s' if node.nproc_per_node > 1 else ''}"
    node_host = memory.host_bytes * node.nproc_per_node
    if host_free is None:
        report.append(f"host {node_host / GB:.1f} GB for {ranks} (MemAvailable not reported)")
    else:
        report.append(f"host {node_host / GB:.1f} GB for {ranks}, {host_free / GB:.1f} GB available")
        problems.append(
            shortfall(f"host memory for {ranks}", node_host, host_free, max(host_terms, key=lambda t: t.bytes))
        )
    found = [p for p in problems if p]
    if found:
        message = (
            f"node {node.node_rank}: "
            + "; ".join(found)
            + "; `python -m flows.finetune --plan` shows every term; launch.require_fit=false trains anyway"
        )
        if spec.config.launch.require_fit:
            raise UserError(message)
        log.warning("%s", message)
        report.append("short: launch.require_fit=false")
    return "; ".join(report)
