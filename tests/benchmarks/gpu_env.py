"""Which packages the trainer and bench_gpu.py need that this Python lacks (tests/benchmarks/GPU.md, step 1).

    python tests/benchmarks/gpu_env.py          # prints the pip names of the missing ones; exit status 1 if any

Only what a run from the checkout imports: the trainer (`python -m trainer`), DeepSpeed and its own requirements,
staging the generated data, and the HF Trainer baseline. Prefect, bitsandbytes (Q-LoRA only) and the pipeline's
other dependencies are not needed.
"""

from __future__ import annotations

import importlib.util
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


def missing() -> list[str]:
    """The pip names of the needed packages this interpreter cannot import."""
    return [pip for module, pip in NEEDED.items() if importlib.util.find_spec(module) is None]


if __name__ == "__main__":
    names = missing()
    print(" ".join(names) if names else "nothing missing")
    sys.exit(1 if names else 0)
