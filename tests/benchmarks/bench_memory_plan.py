"""The memory plan (config/memory_plan.py) against configurations it was not written from: CPU ranks' host memory,
planned and measured, on a model directory of Qwen2.5-0.5B-Instruct's published shape (494M parameters), or of
Qwen3-30B-A3B's with its sizes scaled down to where the experts hold most of the parameters (MOE_SHAPE: 6 layers of
64 experts, 8 a token: 0.58B parameters, 0.34B of them experts' weights, 42M of those active a token).

    .venv/bin/python tests/benchmarks/bench_memory_plan.py                         # the held-out configurations below
    .venv/bin/python tests/benchmarks/bench_memory_plan.py --shape qwen3-moe --ranks 1,2,4
    .venv/bin/python tests/benchmarks/bench_memory_plan.py --shape qwen3-moe --layers 2 --ranks 1,2,4   (fits 24 GB)
    .venv/bin/python tests/benchmarks/bench_memory_plan.py --shape tiny            (toy size)

Each configuration trains 2 steps on 1 node of --ranks ranks (each world size in turn), rows packed to
`data.max_length`; bench_model_scale.py's sampler reads every rank's RssAnon every 0.1 s. Printed: the plan's host
peak per rank (`python -m flows.finetune --plan` of the same settings), the largest RssAnon of any rank over the whole
run, and their ratio; the plan states a 25% error. Asserts nothing about memory.
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
RUN = ["launch.nnodes=1", "train.max_steps=2", "train.save_steps=2"]
RUN += ["train.gradient_accumulation_steps=1", *STAGE]
# Qwen3-30B-A3B scaled so that experts hold most of the parameters (the embeddings at Qwen's vocabulary the rest):
# 6 x 64 experts x 3 x 768 x 384 = 340M of 0.58B; 8 experts a token (as published) make 42M of them active.
MOE_SHAPE = {
    "hidden_size": 768,
    "head_dim": 64,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "num_hidden_layers": 6,
    "max_window_layers": 6,
    "num_experts": 64,
    "moe_intermediate_size": 384,
    "intermediate_size": 1536,
}
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


def shape_dir(shape: str, work: Path, layers: int | None = None) -> str:
    """The model directory of `shape` (bench_model_scale.py's, or the scaled Qwen3-MoE, with `layers` decoder layers
    instead of MOE_SHAPE's 6 when given: 4 ranks of the 6-layer shape need more than a 24 GB machine holds)."""
    if shape != "qwen3-moe":
        if layers is not None:
            raise SystemExit("--layers applies to --shape qwen3-moe only")
        return model_dir(shape, work)
    from tests.published import QWEN3_30B_A3B, QWEN3_GENERATION, write_published
    from trainer.model.tiny_qwen import qwen_tokenizer_dir

    sizes = {**QWEN3_30B_A3B, **MOE_SHAPE}
    if layers is not None:
        sizes |= {"num_hidden_layers": layers, "max_window_layers": layers}
    return str(write_published(work / "qwen3-moe", sizes, QWEN3_GENERATION, qwen_tokenizer_dir()))


def run(shape: str, ranks: list[int], layers: int | None = None) -> dict[tuple[str, int], dict[str, float]]:
    """Every configuration at every world size of `ranks`: planned and measured GB a rank, keyed (label, ranks)."""
    work = Path(tempfile.mkdtemp(prefix="tandem-bench-plan-"))
    results = {}
    try:
        staged = stage(work / "storage", shape_dir(shape, work, layers), STAGE)
        for world in ranks:
            for index, (label, settings) in enumerate(CONFIGURATIONS.items()):
                name, overrides = f"plan-{index}-{world}", [*RUN, f"launch.nproc_per_node={world}", *settings]
                with Sampler(f"runs/{name}/spec.json") as sampler:
                    train(staged, name, overrides)
                measured = max((anon for _, _, anon, _ in sampler.samples), default=0.0) * 2**30 / GB
                planned = planned_gb(staged, name, overrides)
                results[(label, world)] = {"planned_gb": planned, "measured_gb": measured, "ratio": planned / measured}
                print(
                    f"{label}, {world} rank(s): planned {planned:.2f} GB, measured {measured:.2f} GB, "
                    f"{planned / measured:.2f}x",
                    flush=True,
                )
                shutil.rmtree(work / "storage" / "runs" / name / "checkpoints", ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    title = shape if layers is None else f"{shape} ({layers} layers)"
    print(f"\n{title}:\n| configuration | CPU ranks | planned GB a rank | measured RssAnon GB | planned / measured |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for (label, world), r in results.items():
        print(f"| {label} | {world} | {r['planned_gb']:.2f} | {r['measured_gb']:.2f} | {r['ratio']:.2f} |")
    return results


def main(argv: list[str] | None = None) -> dict[tuple[str, int], dict[str, float]]:
    """The script's entry point; returns the figures (tests/benchmarks/test_toy_runs.py runs it small)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=("qwen2.5-0.5b", "qwen3-moe", "tiny"), default="qwen2.5-0.5b")
    parser.add_argument("--ranks", default="2", help="world sizes (ranks on the one node), comma-separated")
    parser.add_argument("--layers", type=int, help="decoder layers of --shape qwen3-moe (default MOE_SHAPE's 6)")
    args = parser.parse_args(argv)
    return run(args.shape, [int(r) for r in args.ranks.split(",")], args.layers)


if __name__ == "__main__":
    main()
