"""Run one node of a job: preflight, then this node's torchrun agent, until it exits.

By hand (or from another scheduler), exactly like Qwen's finetune_lora_ds.sh reads its variables:

    NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.5 MASTER_PORT=6001 python -m flows.node --spec SPEC   # on node 0
    NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.5 MASTER_PORT=6001 python -m flows.node --spec SPEC   # on node 1

Defaults: NNODES=1, NODE_RANK=0, MASTER_ADDR=localhost, MASTER_PORT=6001, GPUS_PER_NODE=all visible
GPUs (on a machine without GPUs: launch.nproc_per_node of the spec). In a Kubeflow Trainer TrainJob's pod the PET_*
variables its controller injects stand in for unset ones, and in an indexed Job's pod JOB_COMPLETION_INDEX is the
node rank (the `kubernetes` backend). The `prefect` launch backend runs
the same code as the flow `node` (deployment node/...), one flow run per node, and the `ssh` backend runs it on
each host (the `local` backend runs the same `run_node` in a thread per node). Two hosts started with the same
NODE_RANK both stop within seconds, naming each other; when one node fails, the others stop within seconds too
({run}/nodes/stop.json). `--phase probe` runs the preflight and the network probe only (no training): a quick test
of the links between the nodes.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from prefect import flow, get_run_logger

from core.errors import UserError
from core.redact import install_log_masking
from flows.cli import run_cli
from launch.command import DEFAULT_MASTER_PORT
from launch.job import MODULES, NodePlan, PhaseJob
from launch.node import run_node
from launch.preflight import visible_gpus
from storage.location import ARGUMENT_FORM, Location, location_argument
from storage.spec import WrittenSpec, load_spec

log = logging.getLogger("tandem.node")


def node_job(spec_url: Location, phase: str, model_url: str | None, expected_spec_digest: str | None) -> PhaseJob:
    """This node's part of a phase: spec.json read back for a node process."""
    # spec.json is read with the options its --spec carries (none when started by hand with a plain URL: then the
    # environment's AWS_ENDPOINT_URL and profile reach the store); everything else through the spec's run location.
    spec, digest = load_spec(spec_url)
    install_log_masking(spec.config.launch.forward_env)
    # Preflight checks the bytes this node reads against the digest the pipeline recorded, when it sent one.
    written = WrittenSpec(spec, spec.run.with_url(spec_url.url), expected_spec_digest or digest)
    return PhaseJob(written, phase, model_url)


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


# Where a node finds its place when Qwen's variable is not set: what Kubeflow Trainer's torch plugin injects into a
# TrainJob's pods, then the completion index of an indexed Job (launch/backends/kubernetes_render.py).
ALTERNATIVES = {
    "NODE_RANK": ("PET_NODE_RANK", "JOB_COMPLETION_INDEX"),
    "NNODES": ("PET_NNODES",),
    "MASTER_ADDR": ("PET_MASTER_ADDR",),
    "MASTER_PORT": ("PET_MASTER_PORT",),
    "GPUS_PER_NODE": ("PET_NPROC_PER_NODE",),
}


def from_environment(name: str) -> tuple[str, str] | None:
    """(the variable that was set, its value) for one of Qwen's names or its alternatives; PET_NPROC_PER_NODE=auto
    (the plugin's default) counts as unset."""
    for candidate in (name, *ALTERNATIVES.get(name, ())):
        value = os.environ.get(candidate)
        if value is not None and value != "auto":
            return candidate, value
    return None


def plan_from_environment(default_nproc: int) -> NodePlan:
    """NNODES / NODE_RANK / MASTER_ADDR / MASTER_PORT / GPUS_PER_NODE (or a TrainJob's PET_* and an indexed Job's
    JOB_COMPLETION_INDEX), with Qwen's defaults."""

    def number(name: str, default: int) -> int:
        found = from_environment(name)
        if found is None:
            return default
        if not found[1].isdigit():
            raise _env_error(*found)
        return int(found[1])

    nproc = number("GPUS_PER_NODE", visible_gpus() or default_nproc)
    master = from_environment("MASTER_ADDR")
    return NodePlan(
        number("NODE_RANK", 0),
        number("NNODES", 1),
        nproc,
        master[1] if master else "localhost",
        number("MASTER_PORT", DEFAULT_MASTER_PORT),
    )


def _env_error(name: str, raw: str) -> Exception:
    return UserError(f"{name}={raw!r}: must be a non-negative integer")


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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", force=True)

    def body() -> int:
        job = node_job(args.spec, args.phase, args.model, args.spec_digest)
        run_node(job, plan_from_environment(job.written.spec.config.launch.nproc_per_node))
        return 0

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
