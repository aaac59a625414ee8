"""Which packages the trainer and bench_gpu.py need that this Python lacks (tests/benchmarks/GPU.md, step 1).

    python tests/benchmarks/gpu_env.py          # prints the pip names of the missing ones; exit status 1 if any

Only what a run from the checkout imports: the trainer (`python -m trainer`), DeepSpeed and its own requirements,
staging the generated data, and the HF Trainer baseline. Prefect, bitsandbytes (Q-LoRA only) and the pipeline's
other dependencies are not needed. Besides, setuptools 70.1 or newer: the build backend that installs the project
itself offline (tests/gpu/install.sh; editable wheels, `bdist_wheel` built in).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys

# import name -> pip distribution name
NEEDED = {
    "torch": "torch",
    "transformers": "transformers",
    "peft": "peft",
    "accelerate": "accelerate",
    "tokenizers": "tokenizers",
    "safetensors": "safetensors",
    "jinja2": "jinja2",
    "deepspeed": "deepspeed",
    "hjson": "hjson",
    "cpuinfo": "py-cpuinfo",
    "msgpack": "msgpack",
    "einops": "einops",
    "ninja": "ninja",
    "psutil": "psutil",
    "packaging": "packaging",
    "tqdm": "tqdm",
    "pydantic": "pydantic",
    "yaml": "pyyaml",
    "fsspec": "fsspec",
    "pyarrow": "pyarrow",
    "blake3": "blake3",
    "orjson": "orjson",
    "numpy": "numpy",
}
BUILD_BACKEND, BUILD_BACKEND_MIN = "setuptools", (70, 1)


def missing() -> list[str]:
    """The pip names of the needed packages this interpreter cannot import."""
    names = [pip for module, pip in NEEDED.items() if importlib.util.find_spec(module) is None]
    return [*names, BUILD_BACKEND] if old_build_backend() else names


def old_build_backend() -> bool:
    """Whether this Python lacks setuptools, or has one older than BUILD_BACKEND_MIN."""
    try:
        version = importlib.metadata.version(BUILD_BACKEND)
    except importlib.metadata.PackageNotFoundError:
        return True
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2]) < BUILD_BACKEND_MIN


if __name__ == "__main__":
    names = missing()
    print(" ".join(names) if names else "nothing missing")
    sys.exit(1 if names else 0)
