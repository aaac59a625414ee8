"""The `node` flow: one node of a job as a Prefect flow run, what the `prefect` launch backend starts on each node's
work queue (deployment node/..., run there by a process worker), thin over launch/node.py `run_node`.

Every other node process runs `python -m launch.node` (srun, ssh, a pod, `tandem node` by hand), which imports no
Prefect. `python -m flows.node` is the same command line, kept for the scripts that still type it.
"""

from __future__ import annotations

import sys
from typing import Any

from prefect import flow, get_run_logger

from core.errors import UserError
from launch.job import TRAIN, NodePlan, Phase
from launch.node import main as node_main
from launch.node import run_node
from launch.node_env import node_job
from storage.location import Location


@flow(name="node")
def node(
    spec: str,
    node_rank: int,
    nnodes: int,
    nproc_per_node: int,
    master_addr: str,
    master_port: int,
    phase: str = TRAIN.name,
    model: str | None = None,
    expected_spec_digest: str | None = None,
) -> dict[str, Any]:
    """One node of a multi-node job (the flow the `prefect` launch backend starts on each node's queue); `spec` is the
    run's spec.json and `model` the model to evaluate (phase eval) as `--spec` takes them (a URL, or the JSON location
    with its storage options)."""
    plan = NodePlan(node_rank, nnodes, nproc_per_node, master_addr, master_port)
    evaluated = parsed("model", model) if model is not None else None
    job = node_job(parsed("spec", spec), named_phase(phase), evaluated, expected_spec_digest)
    run_node(job, plan, info=get_run_logger().info)
    return {"node_rank": node_rank, "phase": phase}


def parsed(parameter: str, text: str) -> Location:
    """A location parameter in its command-line form, parsed; a malformed one is a UserError naming the parameter."""
    try:
        return Location.parse(text)
    except ValueError as exc:
        raise UserError(f"{parameter}: {exc}") from None


def named_phase(name: str) -> Phase:
    """The phase parameter, parsed; an unknown name is a UserError naming the parameter."""
    try:
        return Phase.named(name)
    except ValueError as exc:
        raise UserError(f"phase: {exc}") from None


if __name__ == "__main__":
    sys.exit(node_main())
