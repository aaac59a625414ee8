"""What a checkpoint save costs training: background saves (`train.async_save`, the default) against synchronous
ones (`train.async_save=false`, the way before), measured in the same run against the same steps without saves.

    .venv/bin/python tests/benchmarks/bench_async_save.py    # 0.5B, 1 rank, local; a 4-layer cut, 2 ranks, local and S3
    .venv/bin/python tests/benchmarks/bench_async_save.py --cases tiny:1:local,tiny:2:s3    (toy size)
    .venv/bin/python tests/benchmarks/bench_async_save.py --cases qwen2.5-0.5b:1:local:1  (training on one core)

Each case is a model shape, a world size (one node), a storage and optionally the number of compute threads a rank
gets (OMP_NUM_THREADS): on this 2-core machine a rank's compute takes every core, so the writer's CPU is taken from
the steps; `:1` leaves one core to the writer, as a GPU node's host cores mostly are. It trains full fine-tuning
under ZeRO-3 for 16 steps (micro-batch 1, 64 tokens) three times: without saves in the measured steps, with a save
every 4 steps written synchronously, and with the same saves in the background. "Blocked" for the save of step s is
the wall time of rank 0's steps s-2 to s+4 (`elapsed_s` in metrics.jsonl: the loop's own clock, saves and slowed
steps included) less the same steps of the run without saves; saves are at 4, 8 and 12, and the table quotes the
median. The window after each save (4 steps) must cover its background write: a save whose write is still running at
s+4 is reported, since the rest of its cost would fall outside the window. The ranks' peak RssAnon (sampled every
0.1 s) is reported for each way: the host copy is what a background save costs in memory.

Shapes: `qwen2.5-0.5b` (Qwen2.5-0.5B-Instruct's published shape, random weights: an 8 GB checkpoint), `qwen2.5-0.5b-4l`
(the same cut to 4 layers: 3 GB, small enough to run twice on this machine and to keep in the S3 endpoint, moto's
server, which holds objects in memory), `tiny`. Prints; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_model_scale import Sampler, subprocess_build
from tests.distributed.harness import Staged, stage, train
from tests.published import QWEN25_05B_INSTRUCT, QWEN25_GENERATION, tiny_as_published, write_published

STEPS, EVERY, SAVES = 16, 4, (4, 8, 12)
STAGE = ["data.max_length=64", "data.eval_ratio=0.05"]
RUN = [
    "launch.nnodes=1",
    "train.method=full",
    f"train.max_steps={STEPS}",
    "train.micro_batch_size=1",
    "train.gradient_accumulation_steps=1",
    "train.log_steps=1",
    "train.keep_latest_k=1",
    "deepspeed.config=config/deepspeed/zero3.json",
]
WAYS = {
    "none": [f"train.save_steps={STEPS}"],  # only the last step saves, after the measured steps
    "sync": [f"train.save_steps={EVERY}", "train.async_save=false"],
    "async": [f"train.save_steps={EVERY}", "train.async_save=true"],
}
DEFAULT_CASES = "qwen2.5-0.5b:1:local,qwen2.5-0.5b-4l:2:local,qwen2.5-0.5b-4l:2:s3"


def model_dir(shape: str, work: Path) -> str:
    """The model directory of `shape` (module docstring)."""
    if shape == "tiny":
        if not (work / "tiny-published").exists():
            subprocess_build(work / "tiny")
            tiny_as_published(work / "tiny", work / "tiny-published")
        return str(work / "tiny-published")
    from trainer.model.tiny_qwen import build_qwen25_tokenizer

    config = dict(QWEN25_05B_INSTRUCT)
    if shape == "qwen2.5-0.5b-4l":
        config["num_hidden_layers"] = 4
    out = work / shape
    if not out.exists():
        write_published(out, config, QWEN25_GENERATION, build_qwen25_tokenizer())
    return str(out)


@contextmanager
def s3_storage(work: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A bucket on moto's S3 server on 127.0.0.1 (the data staged there too), with its storage options."""
    from tests.benchmarks.bench_data_scale import s3_endpoint

    with s3_endpoint(True) as endpoint:
        assert endpoint is not None
        import s3fs

        s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True).mkdir("bench-async")
        yield "s3://bench-async/storage", {"endpoint_url": endpoint}


def elapsed(rows: list[dict[str, Any]]) -> dict[int, float]:
    return {r["step"]: r["elapsed_s"] for r in rows if "elapsed_s" in r}


def one_run(staged: Staged, name: str, ranks: int, way: str, extra: list[str]) -> dict[str, Any]:
    """Train once; returns rank 0's step clock, the checkpoint events and the ranks' peak RssAnon."""
    with Sampler(f"runs/{name}/spec.json") as sampler:
        run = train(staged, name, [*RUN, f"launch.nproc_per_node={ranks}", *WAYS[way], *extra])
    rows = run.metrics()
    return {
        "clock": elapsed(rows),
        "saves": [r for r in rows if r.get("event") == "checkpoint"],
        "order": [("save", r["step"]) if r.get("event") == "checkpoint" else ("row", r.get("step")) for r in rows],
        "peak_anon_gb": max((anon for _, _, anon, _ in sampler.samples), default=0.0),
    }


def blocked(run: dict[str, Any], none: dict[str, Any]) -> list[float]:
    """Per save in SAVES: the extra wall time of steps s-2..s+4 over the run without saves."""
    out = []
    for s in SAVES:
        mine = run["clock"][s + 4] - run["clock"][s - 2]
        base = none["clock"][s + 4] - none["clock"][s - 2]
        out.append(mine - base)
    return out


def late_saves(run: dict[str, Any]) -> list[int]:
    """Saves whose COMPLETE was seen only after the row of step s+4 (their write outlasted the window)."""
    order, late = run["order"], []
    for s in SAVES:
        saved_at = order.index(("save", s)) if ("save", s) in order else len(order)
        if saved_at > order.index(("row", s + 4)):
            late.append(s)
    return late


def case(spec: str, work: Path) -> dict[str, Any]:
    shape, ranks_text, where, *threads = spec.split(":")
    ranks = int(ranks_text)
    extra = [f"launch.env={{OMP_NUM_THREADS: '{threads[0]}'}}"] if threads else []
    model = model_dir(shape, work)
    name = spec.replace(":", "-").replace(".", "")
    if where == "s3":
        with s3_storage(work) as (url, options):
            staged = stage(url, model, STAGE, options)
            return measure(staged, name, ranks, extra)
    staged = stage(work / f"storage-{name}", model, STAGE)
    try:
        return measure(staged, name, ranks, extra)
    finally:
        shutil.rmtree(work / f"storage-{name}", ignore_errors=True)


def measure(staged: Staged, name: str, ranks: int, extra: list[str]) -> dict[str, Any]:
    runs = {way: one_run(staged, f"{name}-{way}", ranks, way, extra) for way in WAYS}
    out: dict[str, Any] = {"peak_anon_gb": {way: r["peak_anon_gb"] for way, r in runs.items()}}
    for way in ("sync", "async"):
        out[f"{way}_blocked_s"] = blocked(runs[way], runs["none"])
        out[f"{way}_late"] = late_saves(runs[way])
        out[f"{way}_save_seconds"] = [r["seconds"] for r in runs[way]["saves"]]
        out[f"{way}_gb"] = max((r["bytes"] for r in runs[way]["saves"]), default=0) / 1e9
    out["ratio"] = statistics.median(out["async_blocked_s"]) / statistics.median(out["sync_blocked_s"])
    return out


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| case | checkpoint GB | sync blocked s (median) | async blocked s (median) | async / sync | "
        "peak RssAnon GB none / sync / async | async saves outlasting their window |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for spec, r in results.items():
        peaks = " / ".join(f"{r['peak_anon_gb'][w]:.2f}" for w in WAYS)
        lines.append(
            f"| {spec} | {r['sync_gb']:.2f} | {statistics.median(r['sync_blocked_s']):.2f} | "
            f"{statistics.median(r['async_blocked_s']):.2f} | {r['ratio']:.3f} | {peaks} | "
            f"{r['async_late'] or 'none'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """The script's entry point; returns the figures (tests/benchmarks/test_toy_runs.py runs it small)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=DEFAULT_CASES, help="SHAPE:RANKS:local|s3, comma-separated")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tandem-bench-async-"))
    results = {}
    try:
        for spec in args.cases.split(","):
            results[spec] = case(spec, work)
            print(spec, json.dumps(results[spec]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\nBlocked per save (s): steps s-2..s+4 with the save less without; medians of saves 4, 8, 12:")
    print(table(results))
    return results


if __name__ == "__main__":
    main()
