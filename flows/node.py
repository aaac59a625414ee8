"""Run one node of a job: preflight, then this node's torchrun agent, until it exits.

By hand (or from another scheduler), exactly like Qwen's finetune_lora_ds.sh reads its variables:

    NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.5 MASTER_PORT=6001 python -m flows.node --spec SPEC   # on node 0
    NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.5 MASTER_PORT=6001 python -m flows.node --spec SPEC   # on node 1

Defaults: NNODES=1, NODE_RANK=0, MASTER_ADDR=localhost, MASTER_PORT=6001, GPUS_PER_NODE=all visible
GPUs (on a machine without GPUs: launch.nproc_per_node of the spec). In a Kubeflow Trainer TrainJob's pod the PET_*
variables its controller injects stand in for unset ones, and in an indexed Job's pod JOB_COMPLETION_INDEX is the
node rank (the `kubernetes` backend; launch/node_env.py reads them). The `prefect` launch backend runs
the same code as the flow `node` (deployment node/...), one flow run per node, and the `ssh` backend runs it on
each host (the `local` backend runs the same `run_node` in a thread per node). `--dry-run` prints this node's place
and the torchrun line it would start, and starts nothing. Two hosts started with the same
NODE_RANK both stop within seconds, naming each other; when one node fails, the others stop within seconds too
({run}/nodes/stop.json). `--phase probe` runs the preflight and the network probe only (no training): a quick test
of the links between the nodes.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from prefect import flow, get_run_logger

from core.errors import UserError
from flows.cli import run_cli
from launch.job import MODULES, NodePlan
from launch.node import describe_node, run_node
from launch.node_env import node_job, plan_from_environment
from storage.location import ARGUMENT_FORM, Location, location_argument


@flow(name="node")
def node(
    spec: str,
    node_rank: int,
    nnodes: int,
    nproc_per_node: int,
    master_addr: str,
    master_port: int,
    phase: str = "train",
    model_url: str | None = None,
    expected_spec_digest: str | None = None,
) -> dict[str, Any]:
    """One node of a multi-node job (the flow the `prefect` launch backend starts on each node's queue); `spec` is the
    run's spec.json as `--spec` takes it (its URL, or the JSON location with its storage options)."""
    plan = NodePlan(node_rank, nnodes, nproc_per_node, master_addr, master_port)
    try:
        spec_url = Location.parse(spec)
    except ValueError as exc:
        raise UserError(f"spec: {exc}") from None
    run_node(node_job(spec_url, phase, model_url, expected_spec_digest), plan, info=get_run_logger().info)
    return {"node_rank": node_rank, "phase": phase}


def main(argv: list[str] | None = None) -> int:
    """CLI entry: run this node of the job described by --spec."""
    parser = argparse.ArgumentParser(
        prog="python -m flows.node", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--spec",
        required=True,
        type=location_argument,
        help=f"the run's spec.json (written by flows.finetune or flows.prepare --write-spec): {ARGUMENT_FORM}",
    )
    parser.add_argument("--phase", choices=sorted(MODULES), default="train")
    parser.add_argument("--model", default=None, help="model URL to evaluate (--phase eval)")
    parser.add_argument("--spec-digest", default=None, help="sha256 the pipeline recorded for spec.json (checked)")
    parser.add_argument("--dry-run", action="store_true", help="print what this node would run, then exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", force=True)

    def body() -> int:
        job = node_job(args.spec, args.phase, args.model, args.spec_digest)
        plan = plan_from_environment(job.written.spec.config.launch.nproc_per_node)
        if args.dry_run:
            print(describe_node(job, plan))
        else:
            run_node(job, plan)
        return 0

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
