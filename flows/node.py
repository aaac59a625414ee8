"""Run one node of a job: preflight, then this node's torchrun agent, until it exits.

By hand (or from another scheduler), exactly like Qwen's finetune_lora_ds.sh reads its variables:

    NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.5 MASTER_PORT=6001 python -m flows.node --spec SPEC   # on node 0
    NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.5 MASTER_PORT=6001 python -m flows.node --spec SPEC   # on node 1

Defaults: NNODES=1, NODE_RANK=0, MASTER_ADDR=localhost, MASTER_PORT=6001, GPUS_PER_NODE=all visible
GPUs (on a machine without GPUs: launch.nproc_per_node of the spec). The `prefect` launch backend runs
the same code as the flow `node` (deployment node/...), one flow run per node.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from prefect import flow, get_run_logger

from storage.spec import load_spec
from storage.fs import set_storage_options
from flows.cli import run_cli
from launch.agent import grace_for, kill, start_agent, supervise
from launch.phase import MODULES
from launch.preflight import NodePlan, run_preflight

log = logging.getLogger("tandem.node")


def run_node(spec_url: str, plan: NodePlan, *, phase: str = "train", model_url: str | None = None,
             expected_spec_digest: str | None = None, info: Callable[[str], None] | None = None) -> None:
    """Preflight (training) and run this node's agent until it exits; raise naming the failure."""
    info = info or log.info
    spec, _ = load_spec(spec_url)
    set_storage_options(spec.config.run.storage, spec.config.run.storage_options)
    if phase == "train":
        run_preflight(spec, spec_url, plan, expected_spec_digest=expected_spec_digest, info=info)
    args = ["--spec", spec_url] + (["--model", model_url] if phase == "eval" and model_url else [])
    agent = start_agent(spec.run_url, plan, spec.config.launch, MODULES[phase], args, phase)
    info(f"node {plan.node_rank}/{plan.nnodes}: {phase} started, {plan.nproc_per_node} rank(s), "
         f"rendezvous {plan.master_addr}:{plan.master_port}")
    try:
        supervise([agent], spec.run_url, phase, None)
    finally:
        kill([agent], grace_for(spec.config.launch))
    info(f"node {plan.node_rank}: {phase} finished")


@flow(name="node")
def node(spec_url: str, node_rank: int, nnodes: int, nproc_per_node: int, master_addr: str, master_port: int,
         phase: str = "train", model_url: str | None = None, expected_spec_digest: str | None = None) -> dict[str, Any]:
    """One node of a multi-node job (the flow the `prefect` launch backend starts on each node's queue)."""
    plan = NodePlan(node_rank, nnodes, nproc_per_node, master_addr, master_port)
    run_node(spec_url, plan, phase=phase, model_url=model_url, expected_spec_digest=expected_spec_digest,
             info=get_run_logger().info)
    return {"node_rank": node_rank, "phase": phase}


def visible_gpus() -> int:
    """GPUs this machine shows (0 without nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def plan_from_environment(default_nproc: int) -> NodePlan:
    """NNODES / NODE_RANK / MASTER_ADDR / MASTER_PORT / GPUS_PER_NODE, with Qwen's defaults."""
    def number(name: str, default: int) -> int:
        raw = os.environ.get(name, str(default))
        if not raw.isdigit():
            raise _env_error(name, raw)
        return int(raw)

    nproc = number("GPUS_PER_NODE", visible_gpus() or default_nproc)
    return NodePlan(number("NODE_RANK", 0), number("NNODES", 1), nproc, os.environ.get("MASTER_ADDR", "localhost"),
                    number("MASTER_PORT", 6001))


def _env_error(name: str, raw: str) -> Exception:
    from config.errors import UserError

    return UserError(f"{name}={raw!r}: must be a non-negative integer")


def main(argv: list[str] | None = None) -> int:
    """CLI entry: run this node of the job described by --spec."""
    parser = argparse.ArgumentParser(prog="python -m flows.node", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", required=True, help="URL of the run's spec.json (written by flows.finetune)")
    parser.add_argument("--phase", choices=sorted(MODULES), default="train")
    parser.add_argument("--model", default=None, help="model URL to evaluate (--phase eval)")
    parser.add_argument("--spec-digest", default=None, help="sha256 the pipeline recorded for spec.json (checked)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", force=True)

    def body() -> int:
        spec, _ = load_spec(args.spec)
        plan = plan_from_environment(spec.config.launch.nproc_per_node)
        run_node(args.spec, plan, phase=args.phase, model_url=args.model, expected_spec_digest=args.spec_digest)
        return 0

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
