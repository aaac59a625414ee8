"""A dry run of a run's launch (`python -m flows.finetune --dry-run`): what its backend would start for each phase,
train then eval, as the backend describes it (launch/backend.py `Backend.describe`), before the run exists: nothing
is started, staged or written, and no cluster or API is asked.

What only the run knows shows as a placeholder: the run id (RUN-ID, unless run.name is set), spec.json's digest
(SPEC-DIGEST) and the model the evaluation reads (MODEL: the last step's checkpoint or its export, `eval.model`).
"""

from __future__ import annotations

from typing import Any

from config.schema import FinetuneConfig
from launch.job import EVAL, TRAIN, Phase, PhaseJob
from launch.phase import run_backend
from storage import layout
from storage.location import join
from storage.spec import Spec, WrittenSpec

PLANNED_RUN = "RUN-ID"
PLANNED_DIGEST = "SPEC-DIGEST"
PLANNED_MODEL = "MODEL"
PHASES = (TRAIN, EVAL)  # what a pipeline launches, in order (the network probe runs inside train's preflight)


def planned_job(cfg: FinetuneConfig, phase: Phase) -> PhaseJob:
    """`phase` of a run of `cfg` as the pipeline would launch it, with the placeholders above."""
    run_id = cfg.run.name or PLANNED_RUN
    run = layout.run_dir(cfg.run, run_id)
    # Only what a launcher reads of a spec before the run exists: its id, its directory and its config. The rest
    # (the staged dataset, the resolved DeepSpeed config, the step count) comes from staging, which a dry run skips:
    # those fields are left unset rather than made up, so a description that read one fails its test.
    known: dict[str, Any] = {"run_id": run_id, "run": run, "config": cfg}
    spec = Spec.model_construct(**known)
    model = join(run, PLANNED_MODEL) if phase.takes_model else None
    return PhaseJob(WrittenSpec(spec, join(run, layout.SPEC), PLANNED_DIGEST), phase, model)


def dry_run_text(cfg: FinetuneConfig) -> str:
    """Every phase of a run of `cfg` as its backend would launch it, with a header saying what the placeholders are."""
    backend = run_backend(cfg)
    head = (
        f"# Dry run of launch.backend={cfg.launch.backend}: nothing was started or written. Each phase as it would "
        f"be launched; {PLANNED_RUN} is the run id (run.name when set), {PLANNED_DIGEST} spec.json's sha256, "
        f"{PLANNED_MODEL} the model evaluated.\n"
    )
    return head + "".join(f"# --- {phase}\n{backend.describe(planned_job(cfg, phase))}" for phase in PHASES)
