"""The trainers bench_gpu.py ranks, one run of each, and the figures that rank them (medians, spread, ratios).

Three kinds of trainer run on the same model, staged rows, DeepSpeed JSON and precision:
- "HF Trainer": the Hugging Face Trainer plain (hf_trainer_baseline.py: its defaults, rows padded to the longest);
- "HF Trainer at its best": the same with `use_liger_kernel` and transformers' `DataCollatorWithFlattening`
  (padding-free packing), what LLaMA-Factory's and axolotl's users run (`--best` of hf_trainer_baseline.py);
- Tandem's variants ("tandem (...)": its overrides).
bench_gpu.py runs them interleaved (A B C A B C ...), so that a drift of the machine (clocks, heat, a neighbour)
spreads over every trainer rather than falling on one.

    python tests/benchmarks/gpu_trainers.py RESULT.json...   # a ranking's figures against the GPU issue's goals
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from core.errors import TandemError  # after the checkout is on sys.path

HF_PLAIN = "HF Trainer"
HF_BEST = "HF Trainer at its best"


@dataclass(frozen=True)
class Trainer:
    """One trainer of a ranking: the HF Trainer (with the baseline script's flags) or Tandem (with overrides)."""

    name: str
    hf_flags: tuple[str, ...] | None = None  # None: Tandem's trainer
    overrides: tuple[str, ...] = ()


def trainers(options: argparse.Namespace) -> list[Trainer]:
    """The trainers of one repeat, in their order: HF plain, HF at its best, then Tandem's variants. Tandem's variants:
    one per --loss-chunk-tokens value, then one per --variant (its overrides on the first --loss-chunk-tokens value,
    if any). --profile-steps profiles the first Tandem variant."""
    chunks = options.loss_chunk_tokens
    named = {f"tandem (loss_chunk_tokens={c})": [f"train.loss_chunk_tokens={c}"] for c in chunks}
    if options.profile_steps and named:
        named[next(iter(named))].append(f"train.profile_steps={options.profile_steps}")
    for extra in options.variant:
        named[f"tandem ({extra})"] = [*[f"train.loss_chunk_tokens={c}" for c in chunks[:1]], *extra.split()]
    if options.profile_steps and not chunks and named:
        named[next(iter(named))].append(f"train.profile_steps={options.profile_steps}")
    hf = [Trainer(HF_PLAIN, ())] if options.hf else []
    hf += [Trainer(HF_BEST, ("--best",))] if options.hf_best else []
    return [*hf, *(Trainer(name, None, tuple(overrides)) for name, overrides in named.items())]


def run_hf(trainer: Trainer, model: str, dataset: object, base: list[str], run: str, options, work: Path) -> dict:
    """One run of the HF Trainer: its tokens/s and peak memory, and what it applied (Liger, flattening)."""
    from tests.benchmarks.bench_train import huggingface_result

    hf_base = [*base, *(["train.compile=true"] if options.hf_compile else [])]
    result = huggingface_result(model, dataset, hf_base, run, options.steps, work, trainer.hf_flags or ())
    row = {"tokens_per_s": result["tokens"] / result["seconds"], "peak_memory_gb": result.get("peak_memory_gb")}
    if trainer.hf_flags:
        row["liger"] = result.get("liger")
        row["flattened"] = result.get("flattened")
        if not result.get("liger"):
            row["liger_skipped"] = "use_liger_kernel needs CUDA: not applied on this machine (flattening ran)"
    return row


def run_tandem(trainer: Trainer, model: str, dataset: object, base: list[str], run: str, options, work: Path) -> dict:
    """One run of Tandem's trainer: its tokens/s after the warm-up (profiled steps left out) and peak memory."""
    from tests.benchmarks.bench_train import ours_steps, tokens_per_s

    rows = ours_steps(model, dataset, base, run, options.steps, list(trainer.overrides))
    measured = [r for r in rows if not r.get("profiled")]
    if not measured:
        raise SystemExit(f"--steps {options.steps}: every step after the warm-up was profiled; raise it")
    keep_profile(work, run, options.out)
    # A full fine-tuning run of the 1.5B shape leaves about 24 GB of checkpoint and export: a GPU machine's disk holds
    # two or three.
    shutil.rmtree(work / "storage" / "runs" / run, ignore_errors=True)
    return {
        "tokens_per_s": tokens_per_s(measured),
        "peak_memory_gb": max((r.get("peak_memory_gb", 0.0) for r in rows), default=0.0) or None,
        "steps_measured": len(measured),
    }


def run_once(trainer: Trainer, model: str, dataset: object, base: list[str], run: str, options, work: Path) -> dict:
    """One repeat of one trainer; a failure is kept as {"error": its first line} and the others still run."""
    runner: Callable[..., dict] = run_tandem if trainer.hf_flags is None else run_hf
    try:
        return {"run": run, **runner(trainer, model, dataset, base, run, options, work)}
    except (TandemError, subprocess.SubprocessError, OSError, RuntimeError) as error:  # a fast path that breaks
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"{run} ({trainer.name}) failed: {message}", flush=True)
        return {"run": run, "error": message}


def keep_profile(work: Path, run: str, out: Path) -> None:
    """Copy a profiled run's rank-0 table (train.profile_steps) beside the JSON, named after the run."""
    for table in (work / "storage").glob(f"runs/{run}/profile/rank-0.txt"):
        kept = out.with_name(f"{out.stem}-profile-{run}.txt")
        shutil.copyfile(table, kept)
        print(f"profile of {run}: {kept}", flush=True)


def summary(rows: list[dict]) -> dict:
    """Medians over the repeats that ran, the spread of tokens/s (min..max), and every repeat's figures (a failed
    one's error)."""
    ran = [r for r in rows if "error" not in r]
    speeds = [r["tokens_per_s"] for r in ran]
    memory = [r["peak_memory_gb"] for r in ran if r["peak_memory_gb"] is not None]
    return {
        "tokens_per_s": statistics.median(speeds) if speeds else None,
        "tokens_per_s_min": min(speeds) if speeds else None,
        "tokens_per_s_max": max(speeds) if speeds else None,
        "runs": len(ran),
        "peak_memory_gb": statistics.median(memory) if memory else None,
        "repeats": rows,
    }


def ratios(summaries: dict[str, dict]) -> dict[str, dict]:
    """Each Tandem variant against the HF Trainer plain and at its best: tokens/s (medians) and peak memory (Tandem's
    over the HF Trainer's: 0.70 is 30% below). A ratio whose figures are missing is None."""

    def over(name: str, baseline: str, key: str) -> float | None:
        ours, theirs = summaries[name].get(key), summaries.get(baseline, {}).get(key)
        return ours / theirs if ours and theirs else None

    return {
        name: {
            "tokens_per_s_vs_hf_plain": over(name, HF_PLAIN, "tokens_per_s"),
            "tokens_per_s_vs_hf_best": over(name, HF_BEST, "tokens_per_s"),
            "peak_memory_vs_hf_plain": over(name, HF_PLAIN, "peak_memory_gb"),
            "peak_memory_vs_hf_best": over(name, HF_BEST, "peak_memory_gb"),
        }
        for name in summaries
        if name.startswith("tandem")
    }


# The goals a ranking answers (the GPU issue): Tandem's tokens/s over the HF Trainer's plain and at its best, its peak
# memory over the plain HF Trainer's, full fine-tuning's MFU, and the 7B case against NeMo's published 14,110 (x1.1).
GOALS = {
    "tokens_per_s_vs_hf_plain": ("lora", 1.3, ">="),
    "tokens_per_s_vs_hf_best": ("lora", 1.0, ">="),
    "peak_memory_vs_hf_plain": (None, 0.70, "<="),
}


def verdicts(document: dict) -> list[str]:
    """One line per case and Tandem variant: each goal's figure and whether it is met (a missing figure is said)."""
    lines = []
    for result in document["results"]:
        for name, ratio in result.get("ratios", {}).items():
            for key, (method, goal, sense) in GOALS.items():
                if method and result["method"] != method:
                    continue
                figure = ratio.get(key)
                met = figure is not None and (figure >= goal if sense == ">=" else figure <= goal)
                shown = f"{figure:.2f}" if figure is not None else "not measured"
                lines.append(
                    f"{result['case']} {name}: {key} {shown} (goal {sense} {goal}): {'met' if met else 'NOT met'}"
                )
            mfu = result["trainers"][name].get("mfu")
            if result["method"] == "full":
                shown = f"{100 * mfu:.1f}%" if mfu else "not measured"
                lines.append(
                    f"{result['case']} {name}: MFU {shown} (goal >= 40%): {'met' if mfu and mfu >= 0.4 else 'NOT met'}"
                )
        anchor = result.get("anchor")
        if anchor:
            ratio = anchor["tandem_vs_anchor"]
            shown = f"{ratio:.2f}x" if ratio else "not measured"
            lines.append(
                f"{result['case']}: {shown} {anchor['name']} (goal >= 1.10x; device {document['device']}): "
                f"{'met' if ratio and ratio >= 1.1 else 'NOT met'}"
            )
    return lines


if __name__ == "__main__":
    for path in sys.argv[1:]:
        document = json.loads(Path(path).read_text())
        print(
            f"{path} ({document['device']}{', dry run: the figures mean nothing' if document['dry_run_cpu'] else ''})"
        )
        print("\n".join(verdicts(document)))
