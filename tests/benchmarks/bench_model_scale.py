"""Host memory per rank of full fine-tuning under ZeRO-3, by world size: the partitioned load, the live/reuse limits
scaled to the model, the streamed export and the ranks' fixed malloc threshold against the code before them (BASELINE:
every rank loading the whole model, DeepSpeed's 1e9 live/reuse limits, the export gathering every parameter at once),
on a model directory of Qwen2.5-0.5B-Instruct's published shape (494M parameters, random bf16 weights, tied
embeddings).

    .venv/bin/python tests/benchmarks/bench_model_scale.py                      # 1, 2 and 4 ranks; the old way at 1
    .venv/bin/python tests/benchmarks/bench_model_scale.py --ranks 1,2 --old-ranks 1,2
    .venv/bin/python tests/benchmarks/bench_model_scale.py --shape tiny --ranks 1,2 --old-ranks 1   (toy size)

Each run trains 2 steps on 1 node with `--ranks` ranks (micro-batch 1, 64 tokens), saves its checkpoint and exports.
A sampler reads every rank's /proc/PID/status every 0.1 s: RssAnon (what the rank itself holds: tensors, Python
objects) and RssFile (mapped files: libraries, the model's safetensors while it is read; the kernel can drop them) are
reported apart. The ranks log their memory at four points (before loading the model, loaded, engine built, export
start); the table gives RssAnon at the first three, at its peak before the export, and at its peak during the export,
the largest of any rank. The code before (`git archive BASELINE`, run by the same interpreter on data it stages
itself) logs no points: its row has the whole run's peak. It runs only where it fits this machine's memory
(`--old-ranks`): at 1 rank it peaks at about 13 GB, at 2 ranks at about 11 GB each (most of a 24 GB machine). Prints;
asserts nothing about memory.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.distributed.harness import Run, stage, train
from tests.published import QWEN25_05B_INSTRUCT, QWEN25_GENERATION, tiny_as_published, write_published

GB = 2**30
BASELINE = "fe0a17d"  # the last commit before the partitioned load and the streamed export (issue 32)
STAGE = ["data.max_length=64", "data.eval_ratio=0.05"]
RUN = ["launch.nnodes=1", "train.method=full", "train.max_steps=2", "train.save_steps=2", "train.micro_batch_size=1"]
RUN += ["train.gradient_accumulation_steps=1", "deepspeed.config=config/deepspeed/zero3.json"]
# The code before, in its own tree: stage the data and train (tests/distributed/harness.py of that commit).
OLD_DRIVER = """
import json, sys
from tests.distributed.harness import stage, train
storage, model, name, stage_overrides, overrides = sys.argv[1:]
train(stage(storage, model, json.loads(stage_overrides)), name, json.loads(overrides))
"""
POINTS = ("before loading the model", "model loaded", "engine built", "exporting")
LOG_LINE = re.compile(
    r"^(\S+ \S+) \[rank (\d+)/\d+ [^\]]*\] INFO trainer\.metrics: memory, ([^:]+): anonymous ([\d.]+) GB"
)


class Sampler:
    """Samples RssAnon and RssFile of every rank process of one run (their command line names its spec)."""

    def __init__(self, spec_marker: str) -> None:
        self.marker, self.samples = spec_marker, []  # (time, pid, anon GB, file GB)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def ranks(self) -> list[int]:
        pids = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if self.marker in cmd and " -m trainer " in cmd + " " and "torch.distributed.run" not in cmd:
                    pids.append(int(proc.name))
        return pids

    def run(self) -> None:
        while not self.stop.is_set():
            for pid in self.ranks():
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                values = dict(re.findall(r"^(RssAnon|RssFile):\s+(\d+) kB", status, re.M))
                if len(values) == 2:
                    self.samples.append(
                        (time.time(), pid, int(values["RssAnon"]) / 2**20, int(values["RssFile"]) / 2**20)
                    )
            time.sleep(0.1)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()


def points(run: Run) -> dict[str, float]:
    """The ranks' logged RssAnon at each point (the largest of any rank) and when the export started (rank 0)."""
    found: dict[str, float] = {}
    for path in (run.run_dir / "nodes").glob("*/log.txt"):
        for line in path.read_text().splitlines():
            if match := LOG_LINE.match(line):
                stamp, rank, point, anon = match.groups()
                key = point.split(" (")[0]
                found[key] = max(found.get(key, 0.0), float(anon))
                if key == "exporting" and rank == "0":
                    found["export_at"] = time.mktime(time.strptime(stamp.split(",")[0], "%Y-%m-%d %H:%M:%S"))
    return found


def measure(staged: object, name: str, ranks: int) -> dict[str, float]:
    """One run of this code: its points, peak RssAnon before and during the export, peak RssFile."""
    with Sampler(f"runs/{name}/spec.json") as sampler:
        run = train(staged, name, [*RUN, f"launch.nproc_per_node={ranks}"])  # type: ignore[arg-type]
    found = points(run)
    export_at = found.pop("export_at", float("inf"))
    before = [anon for at, _, anon, _ in sampler.samples if at < export_at]
    during = [anon for at, _, anon, _ in sampler.samples if at >= export_at]
    found["training peak"] = max(before, default=0.0)
    found["export peak"] = max(during, default=0.0)
    found["file-backed peak"] = max((f for *_, f in sampler.samples), default=0.0)
    found["whole-run peak"] = max(found["training peak"], found["export peak"])
    shutil.rmtree(run.run_dir / "checkpoints", ignore_errors=True)  # 8 GB a run at the 0.5B shape
    return found


def measure_before(model: str, ranks: int, work: Path) -> dict[str, float]:
    """One run of the code before (BASELINE's tree, its own staging): the whole run's peaks (it logs no points)."""
    tree = work / "before"
    if not tree.exists():
        tree.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", BASELINE], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    name = f"before-{ranks}"
    argv = [
        str(work / "storage-before"),
        model,
        name,
        json.dumps(STAGE),
        json.dumps([*RUN, f"launch.nproc_per_node={ranks}"]),
    ]
    with Sampler(f"runs/{name}/spec.json") as sampler:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        env.pop("MALLOC_MMAP_THRESHOLD_", None)  # as before: glibc's own
        subprocess.run([sys.executable, "-c", OLD_DRIVER, *argv], cwd=tree, env=env, check=True)
    peak = max((anon for _, _, anon, _ in sampler.samples), default=0.0)
    shutil.rmtree(work / "storage-before" / "runs" / name / "checkpoints", ignore_errors=True)
    return {"whole-run peak": peak, "file-backed peak": max((f for *_, f in sampler.samples), default=0.0)}


def model_dir(shape: str, work: Path) -> str:
    """The model directory of `shape`: Qwen2.5-0.5B-Instruct as published, or the tiny model laid out so."""
    if shape == "tiny":
        tiny = work / "tiny"
        subprocess_build(tiny)
        return str(tiny_as_published(tiny, work / "tiny-published"))
    from trainer.model.tiny_qwen import build_qwen25_tokenizer

    return str(write_published(work / "qwen05", QWEN25_05B_INSTRUCT, QWEN25_GENERATION, build_qwen25_tokenizer()))


def subprocess_build(out: Path) -> None:
    """The built-in tiny model, built as the pipeline builds it."""
    corpus = ROOT / "data" / "sample" / "conversations.json"
    subprocess.run([sys.executable, "-m", "trainer.model.tiny", "--out", str(out), "--corpus", str(corpus)], check=True)


def table(results: dict[tuple[int, bool], dict[str, float]]) -> str:
    """The figures as a markdown table, with each world size's whole-run peak against 1 rank's (the same code)."""
    columns = [*POINTS[:3], "training peak", "export peak", "whole-run peak", "file-backed peak"]
    lines = ["| ranks | way | " + " | ".join(columns) + " | peak vs 1 rank |", "|" + " --- |" * (len(columns) + 3)]
    for (ranks, old), found in sorted(results.items()):
        one = results.get((1, old), {}).get("whole-run peak")
        ratio = f"{found['whole-run peak'] / one:.2f}x" if one else "n/a"
        cells = " | ".join(f"{found.get(c, float('nan')):.2f}" for c in columns)
        lines.append(f"| {ranks} | {'before' if old else 'partitioned + streamed'} | {cells} | {ratio} |")
    return "\n".join(lines)


def run(shape: str, ranks: list[int], old_ranks: list[int]) -> dict[tuple[int, bool], dict[str, float]]:
    work = Path(tempfile.mkdtemp(prefix="tandem-bench-model-"))
    try:
        model = model_dir(shape, work)
        staged = stage(work / "storage", model, STAGE)
        results = {}
        for world in ranks:
            for old in (False, True) if world in old_ranks else (False,):
                results[(world, old)] = (
                    measure_before(model, world, work) if old else measure(staged, f"new-{world}", world)
                )
                print(f"{world} rank(s), {'before' if old else 'new'}: {results[(world, old)]}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\nRssAnon per rank, GB (the largest of any rank):\n" + table(results))
    return results


def main(argv: list[str] | None = None) -> dict[tuple[int, bool], dict[str, float]]:
    """The script's entry point; returns the figures (tests/benchmarks/test_toy_runs.py runs it small)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=("qwen2.5-0.5b", "tiny"), default="qwen2.5-0.5b")
    parser.add_argument("--ranks", default="1,2,4", help="world sizes, comma-separated")
    parser.add_argument("--old-ranks", default="1", help="world sizes to also run the way before at")
    args = parser.parse_args(argv)
    numbers = [int(r) for r in args.ranks.split(",")]
    return run(args.shape, numbers, [int(r) for r in args.old_ranks.split(",") if r])


if __name__ == "__main__":
    main()
