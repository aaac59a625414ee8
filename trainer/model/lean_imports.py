"""What a rank's libraries import at start-up for features the run does not use, kept from costing it.

A rank's start-up is paid on every launch, by every rank: measured with py-spy on a 2-rank LoRA run on a CPU, these
two imports were ~2.8 s of the ~7 s of CPU a rank spent in all (a 12-step launch went from ~11 s to ~8.5 s); MLflow,
which DeepSpeed imports when it is installed, ~1.1 s more (`python -X importtime`: 5.7 s of imports -> 4.6 s).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from config.methods import Method

BITSANDBYTES = "bitsandbytes"
MLFLOW = "mlflow"
# transformers imports SciPy for its object-detection losses whenever it is installed, and accelerate imports boto3 for
# its SageMaker config: neither is a language model's, and together they were ~20% of a training rank's imports
# (`python -X importtime`: scipy.optimize 1.9 s and boto3 0.9 s of 10.2 s for transformers' Qwen2 module, on the
# loaded 2-core machine). A rank reaches S3 through s3fs and aiobotocore, never boto3.
SCIPY = "scipy"
BOTO3 = "boto3"
DEEPSPEED_MUON = "deepspeed.runtime.zero.muon.muon_optimizer"


def skip_tracking_libraries() -> None:
    """Keep MLflow out of this process: DeepSpeed's autotuner imports it whenever it is installed (~3 s of a rank's
    start on the 2-core machine, `python -X importtime -m trainer`), and a rank never tracks anything (the pipeline's
    process does). A None entry in sys.modules is how Python marks a module as absent."""
    if MLFLOW not in sys.modules:
        sys.modules[MLFLOW] = None  # type: ignore[assignment]


def skip_unused_libraries(method: Method, *, training: bool) -> None:
    """Keep a rank from importing what it never uses. A None entry in sys.modules is how Python marks a module as
    absent: the importer takes its "not installed" path, as on a machine without it (transformers and accelerate ask
    `importlib.util.find_spec`, which answers None for it). Call before anything imports transformers, DeepSpeed or
    PEFT.

    - bitsandbytes, unless Q-LoRA: PEFT imports it whenever it is installed; its CPU backends and the torch.compile
      modules they pull in cost ~1.5 s.
    - MLflow: DeepSpeed's autotuner imports it whenever it is installed (the `mlflow` extra), ~1.1 s; a rank never
      tracks anything (the pipeline's process does).
    - boto3: accelerate's SageMaker config, on every rank.
    - SciPy, on a `training` rank only: the evaluate stage's benchmark tasks (lm-evaluation-harness, eval.tasks) may
      compute with it."""
    skip_tracking_libraries()
    absent = [BOTO3, *([] if method.quantizes_base else [BITSANDBYTES]), *([SCIPY] if training else [])]
    for name in absent:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]


def import_muon_uncompiled_unless_configured(ds_config: dict[str, Any]) -> None:
    """DeepSpeed imports its Muon optimizer module during ZeRO set-up whatever the optimizer (to check types against
    it), and that module torch.compiles a kernel at import: ~1.3 s, for an optimizer this run does not use. Import it
    first with torch.compile as the identity (its kernel stays eager; only Muon would call it), so the set-up finds it
    imported. Call before deepspeed.initialize; a run configured for Muon imports it as DeepSpeed does."""
    if "muon" in str(ds_config.get("optimizer", {}).get("type", "")).lower() or DEEPSPEED_MUON in sys.modules:
        return
    import torch

    def eager(model: Any = None, **_: Any) -> Any:
        return model if model is not None else (lambda fn: fn)

    compile_ = torch.compile
    torch.compile = eager
    try:
        importlib.import_module(DEEPSPEED_MUON)
    finally:
        torch.compile = compile_
