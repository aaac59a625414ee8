"""A rank keeps out what it never uses: MLflow and boto3 always, bitsandbytes unless Q-LoRA, SciPy on a training rank
(as on a machine without them); a third party's import of them then takes its "not installed" path, and transformers'
Qwen2 model and PEFT still import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

PROBE = """
import sys
from config.methods import METHODS
from trainer.model.lean_imports import skip_unused_libraries
skip_unused_libraries(METHODS[{method!r}], training={training!r})
for name in ("mlflow", "bitsandbytes", "boto3", "scipy", "numpy"):
    print(name, "absent" if name in sys.modules and sys.modules[name] is None else "importable")
try:
    import mlflow
except ImportError:
    print("import mlflow: ImportError")
import peft
import transformers.models.qwen2.modeling_qwen2
print("transformers", "without scipy" if "scipy.optimize" not in sys.modules else "with scipy")
"""


@pytest.mark.parametrize(
    ("method", "training", "bitsandbytes", "scipy"),
    [
        ("lora", True, "absent", "absent"),
        ("full", True, "absent", "absent"),
        ("qlora", False, "importable", "importable"),
    ],
)
def test_unused_libraries_import_as_absent(method: str, training: bool, bitsandbytes: str, scipy: str) -> None:
    code = PROBE.format(method=method, training=training)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "mlflow absent",
        f"bitsandbytes {bitsandbytes}",
        "boto3 absent",
        f"scipy {scipy}",
        "numpy importable",
        "import mlflow: ImportError",
        "transformers " + ("without scipy" if scipy == "absent" else "with scipy"),
    ]
