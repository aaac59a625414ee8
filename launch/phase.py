"""One phase (train or eval) on every node, through the configured launch backend."""

from __future__ import annotations

from collections.abc import Callable

from storage.spec import Spec
from launch.local_nodes import run_local_nodes
from launch.prefect_nodes import run_prefect_nodes
from launch.preflight import NodePlan, run_preflight
from launch.slurm_nodes import run_slurm_nodes

MODULES = {"train": "trainer", "eval": "trainer.evaluate"}


def run_phase(spec: Spec, spec_url: str, phase: str, info: Callable[[str], None], *, model_url: str | None = None,
              spec_digest: str | None = None, on_progress: Callable[[dict], None] | None = None) -> None:
    """Run `phase` on every node and return when all finished; preflight precedes training on each node
    (in this process for the local backend, inside each node's own process otherwise)."""
    backend = spec.config.launch.backend
    if backend == "prefect":
        run_prefect_nodes(spec, spec_url, phase, info, model_url=model_url, spec_digest=spec_digest,
                          on_progress=on_progress)
    elif backend == "slurm":
        run_slurm_nodes(spec, spec_url, phase, info, model_url=model_url, spec_digest=spec_digest,
                        on_progress=on_progress)
    else:
        args = ["--spec", spec_url] + (["--model", model_url] if model_url else [])

        def preflight(plan: NodePlan) -> None:
            run_preflight(spec, spec_url, plan, expected_spec_digest=spec_digest, info=info)

        run_local_nodes(spec.run_url, spec.config.launch, MODULES[phase], args, phase, info,
                        on_progress=on_progress, preflight=preflight if phase == "train" else None)
