"""The memory plan (config/memory_plan.py) against configurations it was not written from: CPU ranks' host memory,
planned and measured, on a model directory of Qwen2.5-0.5B-Instruct's published shape (494M parameters).

    .venv/bin/python tests/benchmarks/bench_memory_plan.py                 # the held-out configurations below
    .venv/bin/python tests/benchmarks/bench_memory_plan.py --shape tiny    (toy size)

Each configuration trains 2 steps on 1 node, rows packed to `data.max_length`; bench_model_scale.py's sampler reads
every rank's RssAnon every 0.1 s. Printed: the plan's host peak per rank (`python -m flows.finetune --plan` of the same
settings), the largest RssAnon of any rank over the whole run, and their ratio; the plan states a 25% error. Asserts
nothing about memory.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from config.memory_plan import GB, plan
from tests.benchmarks.bench_model_scale import Sampler, model_dir
from tests.distributed.harness import config, stage, train

STAGE = ["data.max_length=256", "data.packing=true", "data.eval_ratio=0.05"]
RUN = ["launch.nnodes=1", "launch.nproc_per_node=2", "train.max_steps=2", "train.save_steps=2"]
RUN += ["train.gradient_accumulation_steps=1", *STAGE]
# None of these was used while the plan was written (its checks: tests/unit/config/test_memory_plan.py).
CONFIGURATIONS = {
    "full, ZeRO-3, 2 x 256 tokens, gradient checkpointing": [
        "train.method=full",
        "deepspeed.config=config/deepspeed/zero3.json",
        "train.micro_batch_size=2",
        "train.gradient_checkpointing=true",
        "train.async_save=false",
    ],
    "LoRA (dropout 0.05), ZeRO-2, 4 x 256 tokens, background save": [
        "train.method=lora",
        "train.lora.dropout=0.05",
        "train.micro_batch_size=4",
        "train.async_save=true",
    ],
}


def planned_gb(staged: object, name: str, overrides: list[str]) -> float:
    """The plan's host peak per rank (CPU ranks) of the run's config."""
    cfg = config(staged, name, overrides)  # type: ignore[arg-type]
    from config.deepspeed import read_deepspeed_json, resolve_from_train

    ds = resolve_from_train(read_deepspeed_json(cfg.deepspeed.config), cfg.train, cfg.world_size)
    model = json.loads((Path(staged.model_path) / "config.json").read_text())  # type: ignore[attr-defined]
    memory = plan(cfg, ds, model, on_gpu=False)
    assert memory is not None, "no plan for this model"
    return memory.host_bytes / GB


def run(shape: str) -> dict[str, dict[str, float]]:
    work = Path(tempfile.mkdtemp(prefix="tandem-bench-plan-"))
    results = {}
    try:
        staged = stage(work / "storage", model_dir(shape, work), STAGE)
        for index, (label, settings) in enumerate(CONFIGURATIONS.items()):
            name, overrides = f"plan-{index}", [*RUN, *settings]
            with Sampler(f"runs/{name}/spec.json") as sampler:
                train(staged, name, overrides)
            measured = max((anon for _, _, anon, _ in sampler.samples), default=0.0) * 2**30 / GB
            planned = planned_gb(staged, name, overrides)
            results[label] = {"planned_gb": planned, "measured_gb": measured, "ratio": planned / measured}
            print(
                f"{label}: planned {planned:.2f} GB, measured {measured:.2f} GB, {planned / measured:.2f}x", flush=True
            )
            shutil.rmtree(work / "storage" / "runs" / name / "checkpoints", ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n| configuration (2 CPU ranks) | planned GB a rank | measured RssAnon GB | planned / measured |")
    print("| --- | ---: | ---: | ---: |")
    for label, r in results.items():
        print(f"| {label} | {r['planned_gb']:.2f} | {r['measured_gb']:.2f} | {r['ratio']:.2f} |")
    return results


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    """The script's entry point; returns the figures (tests/benchmarks/test_toy_runs.py runs it small)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=("qwen2.5-0.5b", "tiny"), default="qwen2.5-0.5b")
    return run(parser.parse_args(argv).shape)


if __name__ == "__main__":
    main()
