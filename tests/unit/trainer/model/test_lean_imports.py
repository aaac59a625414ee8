"""A rank keeps out what it never uses: MLflow always, bitsandbytes unless Q-LoRA (as on a machine without them); a
third party's import of them then takes its "not installed" path."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

PROBE = """
import sys
from config.methods import METHODS
from trainer.model.lean_imports import skip_unused_libraries
skip_unused_libraries(METHODS[{method!r}])
for name in ("mlflow", "bitsandbytes", "numpy"):
    print(name, "absent" if name in sys.modules and sys.modules[name] is None else "importable")
try:
    import mlflow
except ImportError:
    print("import mlflow: ImportError")
"""


@pytest.mark.parametrize(("method", "bitsandbytes"), [("lora", "absent"), ("full", "absent"), ("qlora", "importable")])
def test_unused_libraries_import_as_absent(method: str, bitsandbytes: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(method=method)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "mlflow absent",
        f"bitsandbytes {bitsandbytes}",
        "numpy importable",
        "import mlflow: ImportError",
    ]
