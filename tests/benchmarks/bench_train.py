"""Training throughput: Tandem's trainer vs the Hugging Face Trainer, same model/data/DeepSpeed/world size.

    .venv/bin/python -m pytest tests/benchmarks/bench_train.py -s        (or: make bench)
    .venv/bin/python tests/benchmarks/bench_train.py --repeats 3 --steps 24
    .venv/bin/python tests/benchmarks/bench_train.py --parts packing --repeats 3 --steps 12 --records 600

Both train a random Qwen2-shaped model (hidden 256, 4 layers) with LoRA under ZeRO-2 on 2 torchrun
"nodes" (1 rank each, gloo, CPU), on generated conversations whose lengths vary as real SFT data does
(log-normal), micro-batch 4 x accumulation 2, max length 512. Throughput is real (non-pad) tokens
per second of step time, skipping warm-up steps; medians of the repeats, run alternately in one
session, and their ratio are printed, with the padding fraction of each side (Tandem groups rows by length, the HF
Trainer does not: most of the ratio, and how much the generated lengths vary moves it), and the same ratio with each
step at its fastest over the repeats (every repeat trains the same batches in order, so a step that another process
slowed in one repeat counts at its time in a quieter one; it still moves when the load lasts through every repeat).
A full-parameter run measures checkpoint save time per GB. The packing part trains the same records staged packed
(data.packing, rows of 512 tokens) and length-grouped (one example per row), alternately, and prints the ratio of
their tokens/s and the padding fraction of each (a step is 16 rows either way, so a packed step holds several times
the tokens). Nothing here asserts a time: it prints.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from config.loader import load_config
from launch.backend import run_job
from launch.backends.local import LocalBackend
from launch.command import free_port, rank_environment, torchrun_command
from launch.job import TRAIN, NodePlan, PhaseJob
from pipeline.plan import build_spec
from staging.stage import stage_dataset
from storage import layout
from storage.spec import WrittenSpec, publish_spec

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "model",
    "token",
    "node",
    "rank",
    "shard",
    "checkpoint",
    "river",
    "copper",
    "signal",
    "orbit",
    "lantern",
    "meadow",
    "harbor",
    "glacier",
    "falcon",
    "ember",
    "quartz",
    "thistle",
    "walnut",
    "timber",
    "canyon",
]
WARMUP_STEPS = 3


def make_data(path: Path, records: int, seed: int = 0, median_words: int = 60, max_words: int = 400) -> None:
    """Conversations with log-normal answer lengths (by default median ~60 words, long tail to ~400)."""
    rng = random.Random(seed)
    with path.open("w") as handle:
        for i in range(records):
            q = " ".join(rng.choices(WORDS, k=rng.randint(5, 20)))
            n = min(max_words, max(3, int(rng.lognormvariate(math.log(median_words), 0.8))))
            a = " ".join(rng.choices(WORDS, k=n))
            handle.write(
                json.dumps(
                    {"id": i, "conversations": [{"from": "user", "value": q}, {"from": "assistant", "value": a}]}
                )
                + "\n"
            )


# A bigger random Qwen2 than the tiny model, so compute, not start-up, dominates on a CPU.
CPU_SHAPE = {
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}


def make_model(tiny_path: str, out: Path, shape: dict | None = None, dtype: str = "float32") -> str:
    """A random Qwen2 of `shape` (Qwen2Config values; the vocabulary is the tokenizer's unless given) with the tiny
    model's tokenizer, saved in `dtype`; built in a subprocess so this process holds none of it."""
    shape = {"vocab_size": None, **(shape or CPU_SHAPE)}
    code = f"""
import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
tok = AutoTokenizer.from_pretrained({tiny_path!r})
torch.manual_seed(0)
torch.set_default_dtype(getattr(torch, {dtype!r}))  # a 7B shape built in bf16 holds half the memory
torch.set_default_device("cuda" if torch.cuda.is_available() else "cpu")  # and is initialised in seconds on a GPU
shape = {shape!r}
cfg = Qwen2Config(**{{**shape, "vocab_size": shape["vocab_size"] or len(tok)}}, pad_token_id=tok.pad_token_id,
                  eos_token_id=tok.eos_token_id)
Qwen2ForCausalLM(cfg).to(getattr(torch, {dtype!r})).save_pretrained({str(out)!r}); tok.save_pretrained({str(out)!r})
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    return str(out)


def setup(work: Path, records: int, packing: bool = False) -> tuple[str, object, list[str]]:
    """(model path, staged dataset, base overrides); with `packing` the same records are also staged packed and the
    dataset is a pair (length-grouped, packed)."""
    data = work / "bench.jsonl"
    make_data(data, records)
    base = [
        f"run.storage={work / 'storage'}",
        f"data.source={data}",
        "data.max_length=512",
        "data.eval_ratio=0.02",
        "launch.nnodes=2",
        "launch.nproc_per_node=1",
        "train.micro_batch_size=4",
        "train.gradient_accumulation_steps=2",
        "train.lora.dropout=0",
    ]
    cfg = load_config(None, base)
    from pipeline.models import (
        resolve_model,  # Prefect: imported here so bench_gpu.py can import this module without it
    )

    model = make_model(resolve_model(cfg), work / "model")
    dataset = stage_dataset(cfg.data, layout.root(cfg.run), model)
    if packing:
        dataset = (dataset, stage_dataset(cfg.data.model_copy(update={"packing": True}), layout.root(cfg.run), model))
    return model, dataset, base


def spec_for(model: str, dataset: object, base: list[str], name: str, extra: list[str]) -> tuple[Any, WrittenSpec]:
    """(config, the written spec) of run `name` over the benchmark's base overrides and `extra`."""
    cfg = load_config(None, [*base, f"run.name={name}", *extra])
    return cfg, publish_spec(build_spec(cfg, name, model, dataset))


class Measured(NamedTuple):
    """One training run after its warm-up: real tokens, each step's seconds, the padding fraction of its positions."""

    tokens: float
    step_seconds: list[float]
    padding: float

    @property
    def tokens_per_s(self) -> float:
        """Real tokens over step time."""
        return self.tokens / sum(self.step_seconds)


def fastest_steps_tokens_per_s(runs: list[Measured]) -> float:
    """Tokens/s with each step at its fastest over the repeats. Every repeat trains the same batches in the same
    order, so a step that another process's load slowed in one repeat counts at its time in a quieter one."""
    fastest = [min(seconds) for seconds in zip(*(r.step_seconds for r in runs), strict=True)]
    return statistics.median(r.tokens for r in runs) / sum(fastest)


def tandem_measured(model: str, dataset: object, base: list[str], name: str, steps: int) -> Measured:
    """Tandem's measurement: its metrics.jsonl step rows after the warm-up."""
    rows = ours_steps(model, dataset, base, name, steps)
    tokens = sum(r["tokens"] for r in rows)
    positions = sum(r["tokens"] / (1 - r["padding_fraction"]) for r in rows)
    return Measured(tokens, [r["step_time_s"] for r in rows], 1 - tokens / positions)


def ours_with_padding(model: str, dataset: object, base: list[str], name: str, steps: int) -> tuple[float, float]:
    """Tandem's (tokens/s, padding fraction over those steps' positions), warm-up skipped."""
    measured = tandem_measured(model, dataset, base, name, steps)
    return measured.tokens_per_s, measured.padding


def ours_steps(
    model: str, dataset: object, base: list[str], name: str, steps: int, extra: list[str] = ()
) -> list[dict]:
    """Train with Tandem's trainer on every node of `base`; its metrics.jsonl step rows after the warm-up."""
    _, written = spec_for(model, dataset, base, name, [f"train.max_steps={steps}", f"train.save_steps={steps}", *extra])
    run_job(LocalBackend(), PhaseJob(written, TRAIN), lambda _: None)
    rows = [json.loads(line) for line in (Path(written.spec.run.url) / layout.METRICS).read_text().splitlines()]
    return [r for r in rows if "event" not in r and r["step"] > WARMUP_STEPS]


def tokens_per_s(steps: list[dict]) -> float:
    """Real tokens over step time of Tandem's step rows."""
    return sum(r["tokens"] for r in steps) / sum(r["step_time_s"] for r in steps)


def hf_measured(model: str, dataset: object, base: list[str], name: str, steps: int, work: Path) -> Measured:
    """The HF Trainer's measurement on the same spec, taken the same way."""
    result = huggingface_result(model, dataset, base, name, steps, work)
    return Measured(result["tokens"], result["step_seconds"], result["padding_fraction"])


def huggingface_result(
    model: str, dataset: object, base: list[str], name: str, steps: int, work: Path, flags: Sequence[str] = ()
) -> dict:
    """hf_trainer_baseline.py's measurement on the same spec: tokens and seconds after the warm-up (and on a GPU
    the peak memory); `flags` go to the script (`--best`: the HF Trainer at its best)."""
    cfg, written = spec_for(model, dataset, base, name, [f"train.max_steps={steps}"])
    url = written.url.argument()
    out = work / f"{name}.json"
    port = free_port()
    script = str(ROOT / "tests" / "benchmarks" / "hf_trainer_baseline.py")
    procs = []
    for node in range(cfg.launch.nnodes):
        plan = NodePlan(node, cfg.launch.nnodes, cfg.launch.nproc_per_node, cfg.launch.rendezvous_addr, port)
        command = torchrun_command(plan, cfg.launch.rdzv_timeout, "trainer", [])
        command = [
            *command[: command.index("-m", 3)],
            script,
            "--spec",
            url,
            "--out",
            str(out),
            "--warmup",
            str(WARMUP_STEPS),
            *flags,
        ]
        procs.append(
            subprocess.Popen(
                command,
                cwd=ROOT,
                env=rank_environment(cfg.launch),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for proc in procs:
        _, err = proc.communicate(timeout=1800)
        if proc.returncode:
            raise RuntimeError(f"HF baseline failed:\n{err[-3000:]}")
    return json.loads(out.read_text())


def checkpoint_seconds_per_gb(model: str, dataset: object, base: list[str]) -> tuple[float, int]:
    """(median checkpoint save time per GB, bytes of one save) of a full-parameter ZeRO-2 run (model + Adam
    states)."""
    _, written = spec_for(
        model,
        dataset,
        base,
        "ckpt-full",
        ["train.method=full", "train.max_steps=6", "train.save_steps=2", "train.learning_rate=1e-4"],
    )
    run_job(LocalBackend(), PhaseJob(written, TRAIN), lambda _: None)
    rows = [json.loads(line) for line in (Path(written.spec.run.url) / layout.METRICS).read_text().splitlines()]
    saves = [r for r in rows if r.get("event") == "checkpoint"]
    return statistics.median(r["seconds"] / (r["bytes"] / 1e9) for r in saves), saves[0]["bytes"]


def packing(repeats: int, steps: int, records: int) -> dict[str, float]:
    """(d) of the prepare benchmark: tokens/s packed vs length-grouped, alternately; prints medians, the ratio and
    the padding fraction of each."""
    work = Path(tempfile.mkdtemp(prefix="tandem-bench-pack-"))
    try:
        model, (grouped, packed), base = setup(work, records, packing=True)
        results: dict[str, list[tuple[float, float]]] = {"grouped": [], "packed": []}
        for i in range(repeats):
            for name, dataset in (("grouped", grouped), ("packed", packed)):
                results[name].append(ours_with_padding(model, dataset, base, f"{name}-{i}", steps))
            print(
                f"repeat {i + 1}: "
                + ", ".join(
                    f"{name} {r[-1][0]:.0f} tokens/s (padding {100 * r[-1][1]:.1f}%)" for name, r in results.items()
                ),
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {
        f"{name}_{key}": statistics.median(r[k] for r in runs)
        for name, runs in results.items()
        for k, key in ((0, "tokens_per_s"), (1, "padding"))
    }
    out["ratio"] = out["packed_tokens_per_s"] / out["grouped_tokens_per_s"]
    print(
        f"\n(d) median of {repeats}: packed {out['packed_tokens_per_s']:.0f} tokens/s (padding "
        f"{100 * out['packed_padding']:.1f}%), length-grouped {out['grouped_tokens_per_s']:.0f} tokens/s (padding "
        f"{100 * out['grouped_padding']:.1f}%), ratio {out['ratio']:.2f}x"
    )
    return out


def run(repeats: int, steps: int, records: int) -> dict[str, float]:
    """Alternate ours / HF `repeats` times; print and return the medians and the ratio."""
    work = Path(tempfile.mkdtemp(prefix="tandem-bench-train-"))
    try:
        model, dataset, base = setup(work, records)
        mine, theirs = [], []
        for i in range(repeats):
            mine.append(tandem_measured(model, dataset, base, f"ours-{i}", steps))
            theirs.append(hf_measured(model, dataset, base, f"hf-{i}", steps, work))
            print(
                f"repeat {i + 1}: tandem {mine[-1].tokens_per_s:.0f} tokens/s (padding "
                f"{100 * mine[-1].padding:.1f}%), HF Trainer {theirs[-1].tokens_per_s:.0f} tokens/s (padding "
                f"{100 * theirs[-1].padding:.1f}%)",
                flush=True,
            )
        per_gb, size = checkpoint_seconds_per_gb(model, dataset, base)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = summary(mine, theirs)
    result["checkpoint_s_per_gb"] = per_gb
    print(f"checkpoint save: {per_gb:.2f} s/GB (median over saves of {size / 1e6:.0f} MB, full fine-tuning, ZeRO-2)")
    return result


def summary(mine: list[Measured], theirs: list[Measured]) -> dict[str, float]:
    """Print and return the medians, their ratio, and the same with each step at its fastest over the repeats."""
    result = {
        "tandem_tokens_per_s": statistics.median(m.tokens_per_s for m in mine),
        "hf_tokens_per_s": statistics.median(t.tokens_per_s for t in theirs),
        "tandem_padding": statistics.median(m.padding for m in mine),
        "hf_padding": statistics.median(t.padding for t in theirs),
        "tandem_fastest_steps_tokens_per_s": fastest_steps_tokens_per_s(mine),
        "hf_fastest_steps_tokens_per_s": fastest_steps_tokens_per_s(theirs),
    }
    result["ratio"] = result["tandem_tokens_per_s"] / result["hf_tokens_per_s"]
    fastest = result["tandem_fastest_steps_tokens_per_s"], result["hf_fastest_steps_tokens_per_s"]
    result["fastest_steps_ratio"] = fastest[0] / fastest[1]
    # The padding of each side says what the ratio is made of: Tandem groups rows by length, the HF Trainer does not.
    print(
        f"\nmedian of {len(mine)}: tandem {result['tandem_tokens_per_s']:.0f} tokens/s (padding "
        f"{100 * result['tandem_padding']:.1f}%), HF Trainer {result['hf_tokens_per_s']:.0f} tokens/s (padding "
        f"{100 * result['hf_padding']:.1f}%), ratio {result['ratio']:.2f}x (goal >= 1.2x)"
    )
    print(
        f"each step at its fastest of the {len(mine)} repeats: tandem {fastest[0]:.0f} tokens/s, HF Trainer "
        f"{fastest[1]:.0f} tokens/s, ratio {result['fastest_steps_ratio']:.2f}x"
    )
    return result


def test_train_throughput_vs_hf_trainer() -> None:
    """On demand (not in the default run): prints the ratio; asserts only that both sides trained."""
    result = run(repeats=3, steps=24, records=1500)
    assert result["tandem_tokens_per_s"] > 0 and result["hf_tokens_per_s"] > 0


def test_packed_vs_length_grouped_throughput() -> None:
    """On demand: prints (d), tokens/s packed vs length-grouped and the padding of each; asserts only that packing
    left less padding."""
    result = packing(repeats=3, steps=12, records=600)
    assert result["packed_padding"] < result["grouped_padding"]


def main(argv: list[str] | None = None) -> dict[str, float]:
    """The script's entry point; returns the printed figures (tests/benchmarks/test_toy_runs.py runs it small)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--steps",
        type=int,
        default=24,
        help=f"optimizer steps per run (the first {WARMUP_STEPS} are warm-up, not measured)",
    )
    parser.add_argument("--records", type=int, default=1500)
    parser.add_argument(
        "--parts",
        choices=("hf", "packing"),
        default="hf",
        help="hf: ours vs the HF Trainer and checkpoint saves; packing: packed vs length-grouped",
    )
    options = parser.parse_args(argv)
    if options.steps <= WARMUP_STEPS:
        parser.error(f"--steps must be > {WARMUP_STEPS} (the warm-up steps are not measured), got {options.steps}")
    return (packing if options.parts == "packing" else run)(options.repeats, options.steps, options.records)


if __name__ == "__main__":
    main()
