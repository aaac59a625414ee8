"""A rank (the launcher's variable set) imports DeepSpeed without MLflow; any other process keeps MLflow."""

from __future__ import annotations

import os
import subprocess
import sys

from storage.layout import RANK_PROCESS_ENV
from tests.conftest import ROOT

PROBE = """
import sys
import trainer.loop  # a rank's entry imports DeepSpeed through it
from deepspeed.autotuning import autotuner
print(autotuner.has_mlflow, sys.modules.get("mlflow", "not imported") is None)
"""


def run_probe(code: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]  # DeepSpeed prints its accelerator line first


def test_a_rank_imports_deepspeed_without_mlflow() -> None:
    assert run_probe(PROBE, {**os.environ, RANK_PROCESS_ENV: "1"}) == "False True"


def test_any_other_process_keeps_mlflow_importable() -> None:
    code = "import sys, trainer, mlflow; print(sys.modules['mlflow'] is not None)"
    assert run_probe(code, {k: v for k, v in os.environ.items() if k != RANK_PROCESS_ENV}) == "True"
