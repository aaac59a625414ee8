"""What a node started as a process of its own is given (`python -m launch.node`: under srun, over ssh, as a pod's
container, by hand; the `node` flow a Prefect worker runs): its job, read back from `--spec`, and its place in the
job, from the environment.

The place is read as Qwen's finetune_lora_ds.sh reads it: NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT, GPUS_PER_NODE,
with its defaults (one node, rank 0, localhost, port 6001, every visible GPU; on a machine without GPUs the spec's
launch.nproc_per_node). In a Kubeflow Trainer TrainJob's pod the PET_* variables its controller injects stand in for
unset ones, and in an indexed Job's pod JOB_COMPLETION_INDEX is the node rank (the `kubernetes` backend's pods).
"""

from __future__ import annotations

import os

from core.errors import UserError
from core.redact import install_log_masking
from launch.command import DEFAULT_MASTER_PORT
from launch.job import NodePlan, Phase, PhaseJob
from launch.preflight import visible_gpus
from storage.location import Location
from storage.spec import WrittenSpec, load_spec

# Where a node finds its place when Qwen's variable is not set: what Kubeflow Trainer's torch plugin injects into a
# TrainJob's pods, then the completion index of an indexed Job (launch/backends/kubernetes_render.py).
ALTERNATIVES = {
    "NODE_RANK": ("PET_NODE_RANK", "JOB_COMPLETION_INDEX"),
    "NNODES": ("PET_NNODES",),
    "MASTER_ADDR": ("PET_MASTER_ADDR",),
    "MASTER_PORT": ("PET_MASTER_PORT",),
    "GPUS_PER_NODE": ("PET_NPROC_PER_NODE",),
}


def node_job(spec_url: Location, phase: Phase, model: Location | None, expected_spec_digest: str | None) -> PhaseJob:
    """This node's part of a phase: spec.json read back for a node process."""
    # spec.json is read with the options its --spec carries (none when started by hand with a plain URL: then the
    # environment's AWS_ENDPOINT_URL and profile reach the store); everything else through the spec's run location.
    spec, digest = load_spec(spec_url)
    install_log_masking(spec.config.launch.forward_env)
    # Preflight checks the bytes this node reads against the digest the pipeline recorded, when it sent one.
    written = WrittenSpec(spec, spec.run.with_url(spec_url.url), expected_spec_digest or digest)
    if model is not None and not model.options:
        model = spec.run.with_url(model.url)  # a plain URL (by hand): under the run's storage, with its options
    return PhaseJob(written, phase, model)


def from_environment(name: str, environ: dict[str, str] | None = None) -> tuple[str, str] | None:
    """(the variable that was set, its value) for one of Qwen's names or its alternatives; PET_NPROC_PER_NODE=auto
    (the plugin's default) counts as unset."""
    environ = dict(os.environ) if environ is None else environ
    for candidate in (name, *ALTERNATIVES.get(name, ())):
        value = environ.get(candidate)
        if value is not None and value != "auto":
            return candidate, value
    return None


def plan_from_environment(default_nproc: int, environ: dict[str, str] | None = None) -> NodePlan:
    """NNODES / NODE_RANK / MASTER_ADDR / MASTER_PORT / GPUS_PER_NODE (or a TrainJob's PET_* and an indexed Job's
    JOB_COMPLETION_INDEX) from `environ` (this process's environment by default), with Qwen's defaults; a number
    that is not one is a UserError naming the variable."""
    environ = dict(os.environ) if environ is None else environ

    def number(name: str, default: int) -> int:
        found = from_environment(name, environ)
        if found is None:
            return default
        if not found[1].isdigit():
            raise UserError(f"{found[0]}={found[1]!r}: must be a non-negative integer")
        return int(found[1])

    nproc = number("GPUS_PER_NODE", visible_gpus() or default_nproc)
    master = from_environment("MASTER_ADDR", environ)
    return NodePlan(
        number("NODE_RANK", 0),
        number("NNODES", 1),
        nproc,
        master[1] if master else "localhost",
        number("MASTER_PORT", DEFAULT_MASTER_PORT),
    )
