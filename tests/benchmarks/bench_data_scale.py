"""Datasets of millions of records: memory, start-up, step and pipeline times at 20k, 200k and 2M generated records,
Tandem's memory-mapped shards against the reader before them, in the same run.

    .venv/bin/python tests/benchmarks/bench_data_scale.py                          # 20k, 200k, 2M records
    .venv/bin/python tests/benchmarks/bench_data_scale.py --records 20000,200000 --no-s3 --out figures.json

The data: the sample's conversations joined four at a time into multi-turn records (about 200 tiny-model tokens
each), numbered so that every record is distinct, written as one JSON array (LLaMA-Factory's form). The model: the
built-in tiny one, on 2 nodes x 1 rank (the local backend). The old way is the code of the commit before the change
(BASELINE, exported with `git archive` and run by the same interpreter, with the same settings), at the sizes where it
fits on this machine (`--old-max-records`: at 2M records each of its ranks would hold about 28 GB).

For each size, and each way:

1. the whole pipeline (`python -m flows.finetune`, on a fresh storage: the tiny model built, the data staged, 2
   training steps, the end-of-training evaluation, the evaluation stage, registration): its wall time; staging's peak
   anonymous memory (the pipeline process and its tokenizer processes, summed, until spec.json is written); the
   ranks' peak RssAnon and RssFile (sampled from /proc every 0.2 s); launch (spec.json written) to the first step;
   its two evaluations: the end-of-training one (the last step's line to the final_eval line of metrics.jsonl) and
   the evaluation stage (final/ complete to eval.json written: its launch included);
2. a training launch of --steps steps on the staged data: launch to first step (a later launch: the node cache holds
   the digests), the ranks' peak RssAnon and RssFile, each step's `data_time_s` (metrics.jsonl; the old way does not
   log it), and its end-of-training evaluation;
3. the per-step data time in one process, the old way's reader against the new (the whole split read into lists and
   the epoch order shuffled at every step, against the mapped shards and an order kept per epoch): the median of
   --steps steps of rank 0 of 2, and the process's RssAnon once the split is open;
4. with S3 (a real S3 endpoint on 127.0.0.1, moto's server: the staged dataset copied there, run.storage on it):
   launch to first step with a cold node cache, then a warm one (the old way: every rank downloads every shard);
5. staging alone (`python -m flows.prepare`, the new way) from the same records as JSON Lines and as Parquet, up to
   --formats-max-records: its wall time and peak anonymous memory.

Then the goals, as ratios of figures of this run. Prints a table; returns the figures. Asserts nothing about time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BASELINE = "c6c4a0f"  # the last commit before the shards were memory-mapped (issue 30): "the old way"
SIZES = (20_000, 200_000, 2_000_000)
GB = 1e9
SETTINGS = [  # the pipeline's and the launches' (beside the tiny-cpu preset: micro-batch 4 x 2 accumulation)
    "launch.nnodes=2",
    "launch.rdzv_timeout=300",
    "data.max_length=512",
    "train.save_steps=1000",
    "train.log_steps=1",
]
PIPELINE_STEPS = ["train.max_steps=2", "train.save_steps=2"]
# moto's endpoint takes any credentials; the children never reach a real store with the user's own.
AWS_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


# --------------------------------------------------------------------------------------------------- the data


def generate(path: Path, records: int) -> None:
    """`records` conversations as one JSON array: four sample conversations joined into one of four exchanges, the
    first question numbered (every record distinct, so the split by digest is a real one)."""
    sample = [r["conversations"] for r in json.loads((ROOT / "data" / "sample" / "conversations.json").read_text())]
    with open(path, "w") as out:
        out.write("[\n")
        for i in range(records):
            turns = [dict(t) for k in range(4) for t in sample[(i + 61 * k) % len(sample)] if t["from"] != "system"]
            turns[0]["value"] = f"({i}) {turns[0]['value']}"
            out.write(("," if i else " ") + json.dumps({"conversations": turns}) + "\n")
        out.write("]\n")


def convert(source: Path, kind: str) -> Path:
    """The JSON array as JSON Lines or Parquet (row groups of 10,000 records), written a batch at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = source.with_suffix(f".{kind}")
    batch: list[Any] = []
    writer = None
    with open(source) as lines, open(target, "w") if kind == "jsonl" else open(os.devnull, "w") as out:
        for line in lines:
            if line.strip() in ("[", "]"):
                continue
            record = json.loads(line[1:])
            if kind == "jsonl":
                out.write(json.dumps(record) + "\n")
                continue
            batch.append(record)
            if len(batch) == 10_000:
                table = pa.Table.from_pylist(batch)
                writer = writer or pq.ParquetWriter(target, table.schema)
                writer.write_table(table)
                batch = []
    if batch:
        table = pa.Table.from_pylist(batch)
        writer = writer or pq.ParquetWriter(target, table.schema)
        writer.write_table(table)
    if writer:
        writer.close()
    return target


# ------------------------------------------------------------------------------------------- memory and events


def status(pid: int) -> dict[str, int]:
    """RssAnon and RssFile of a process, in bytes (empty once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


def children_of() -> dict[int, list[int]]:
    """Every process's children, from /proc."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            out.setdefault(parent, []).append(int(entry))
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass
class Sampler:
    """Samples a process tree every 0.2 s: each rank's peak RssAnon/RssFile (a rank: a child of a torchrun agent),
    the peak of the rest of the tree summed while `staging()` holds, and the first time each watched event is seen."""

    root: int
    staging: Callable[[], bool] = lambda: False
    events: Callable[[], dict[str, float]] = dict
    ranks: dict[int, dict[str, int]] = field(default_factory=dict)
    staging_peak: int = 0
    seen: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self.sample()
            for name, at in self.events().items():
                self.seen.setdefault(name, at)

    def sample(self) -> None:
        tree, todo, agents = [], [self.root], set()
        kids = children_of()
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(kids.get(pid, []))
            if "torch.distributed.run" in cmdline(pid):
                agents.add(pid)
        ranks = {child for agent in agents for child in kids.get(agent, [])}
        for pid in ranks:
            peak = self.ranks.setdefault(pid, {"RssAnon": 0, "RssFile": 0})
            for key, value in status(pid).items():
                peak[key] = max(peak[key], value)
        if self.staging():
            rest = sum(status(pid).get("RssAnon", 0) for pid in tree if pid not in ranks and pid not in agents)
            self.staging_peak = max(self.staging_peak, rest)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def rank_peak(self, key: str) -> float:
        return max((p[key] for p in self.ranks.values()), default=0) / GB


def metrics_events(run: Any) -> Callable[[], dict[str, float]]:
    """When spec.json and metrics.jsonl's first step, last step and final_eval line are first seen (a run directory
    on any storage)."""
    from storage.fs import exists, read_bytes
    from storage.location import join

    def events() -> dict[str, float]:
        now, out = time.time(), {}
        if exists(join(run, "spec.json")):
            out["spec"] = now
        if not exists(join(run, "metrics.jsonl")):
            return out
        lines = [json.loads(line) for line in read_bytes(join(run, "metrics.jsonl")).splitlines() if line.strip()]
        steps = [r for r in lines if "event" not in r]
        if steps:
            out["first_step"] = now
            out[f"step_{steps[-1]['step']}"] = now
        if any(r.get("event") == "final_eval" for r in lines):
            out["final_eval"] = now
        if exists(join(run, "final", "COMPLETE")):
            out["exported"] = now
        if exists(join(run, "eval.json")):
            out["evaluated"] = now
        return out

    return events


# ------------------------------------------------------------------------------------------------ the two ways


@dataclass(frozen=True)
class Way:
    """The code a figure was measured with: this checkout ("new") or the baseline's tree ("old")."""

    name: str
    tree: Path


def old_tree(ref: str, work: Path) -> Way | None:
    """The baseline commit's files (git archive), or None with a note when this checkout cannot give them."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True)
    if archive.returncode:
        print(f"the old way is left out: git archive {ref} failed ({archive.stderr.decode().strip()})", flush=True)
        return None
    tree = work / "old-tree"
    tree.mkdir()
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return Way("old", tree)


def child_env(way: Way, cache: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A child's environment: the way's tree first on the path, one thread per process, the checkout's compiled
    DeepSpeed op (a tree of its own would compile it again), the node cache of this measurement."""
    return {
        **os.environ,
        "PYTHONPATH": str(way.tree),
        "OMP_NUM_THREADS": "1",
        "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".tandem" / "torch_extensions")),
        "TANDEM_NODE_CACHE": str(cache),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        **AWS_CREDENTIALS,
        **(extra or {}),
    }


def run_child(
    way: Way, args: list[str], env: dict[str, str], log: Path, sampler: Callable[[int], Sampler]
) -> tuple[float, Sampler, str]:
    """Run `python ARGS` in the way's tree, sampled; returns (wall s, the sampler, its output)."""
    started = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, *args], cwd=way.tree, env=env, stdout=out, stderr=subprocess.STDOUT)
        watch = sampler(process.pid)
        code = process.wait()
    watch.stop()
    text = log.read_text()
    if code:
        raise RuntimeError(f"{way.name}: {' '.join(args[:3])} exited with {code}:\n{text[-4000:]}")
    return time.perf_counter() - started, watch, text


def driver(way: Way, action: str, spec: dict[str, Any], env: dict[str, str], log: Path, events: Any = None) -> Any:
    """Run one of this script's driver actions in the way's tree; returns (wall s, sampler, its JSON answer)."""
    args = [str(Path(__file__).resolve()), "--driver", action, "--tree", str(way.tree), "--spec", json.dumps(spec)]
    seconds, sampler, text = run_child(way, args, env, log, lambda pid: Sampler(pid, events=events or dict))
    answer = json.loads(text.strip().splitlines()[-1])
    return seconds, sampler, answer


# ------------------------------------------------------------------------------ driver actions (in a way's tree)


def rss_anon_gb() -> float:
    return status(os.getpid()).get("RssAnon", 0) / GB


def act_train(spec: dict[str, Any]) -> dict[str, Any]:
    """Write a spec for the staged dataset and train it on the local backend (the code of the tree on sys.path)."""
    from config.loader import load_config
    from launch.job import TRAIN, PhaseJob
    from pipeline.plan import build_spec, record_model
    from storage.spec import DatasetRef, publish_spec

    cfg = load_config(None, spec["settings"])
    ref = DatasetRef(**spec["dataset"])
    digest = record_model(cfg, spec["name"], spec["model"])
    written = publish_spec(build_spec(cfg, spec["name"], spec["model"], ref, digest))
    try:
        from launch.backend import run_job
        from launch.backends.local import LocalBackend
    except ImportError:  # the baseline's tree, from before the launch interface: its local backend was a function
        from launch.backends.local import run_local_job

        run_local_job(PhaseJob(written, TRAIN), lambda _: None, on_progress=lambda _: None)
    else:
        run_job(LocalBackend(), PhaseJob(written, TRAIN), lambda _: None, on_progress=lambda _: None)
    return {"spec_url": str(written.url)}


def act_data(spec: dict[str, Any]) -> dict[str, Any]:
    """Open the train split and batch `steps` steps of rank 0 of 2 (micro-batch 4 x 2): with the tree's own reader."""
    started = time.perf_counter()
    try:
        from storage.local_dataset import open_split
        from storage.location import Location
        from storage.node_cache import NodeCache
        from trainer.data import GlobalOrder, rank_micro_batches

        rows: Any = open_split(Location(spec["url"]), "train", NodeCache(Path(spec["cache"]), 10**12))
        order = GlobalOrder(len(rows), 42)
        order.epoch(0)  # as the trainer does before its first step

        def batches(step: int) -> list[Any]:
            return list(rank_micro_batches(rows, order, step=step, micro=4, accum=2, rank=0, world=2, pad_id=0))
    except ImportError:  # the old way: every row of the split in lists, the order shuffled again at every step
        from storage.shards import load_split
        from trainer.data import rank_micro_batches as old_batches

        rows = load_split(spec["url"], "train")

        def batches(step: int) -> list[Any]:
            return list(old_batches(rows, seed=42, step=step, micro=4, accum=2, rank=0, world=2, pad_id=0))

    opened, times = time.perf_counter() - started, []
    for step in range(spec["steps"]):
        began = time.perf_counter()
        batches(step)
        times.append(time.perf_counter() - began)
    return {"open_s": opened, "rss_anon_gb": rss_anon_gb(), "step_ms": 1000 * statistics.median(times)}


ACTIONS = {"train": act_train, "data": act_data}


# ------------------------------------------------------------------------------------------------ measurements


@dataclass
class Size:
    """One size's work: its folder, the generated source, the Prefect API and the S3 endpoint (or None)."""

    records: int
    work: Path
    source: Path
    api: str
    steps: int
    s3: str | None
    old_s3_max: int  # the largest size at which the old way launches on S3 too

    def env(self, way: Way, cache: str, **extra: str) -> dict[str, str]:
        return child_env(way, self.work / cache, {"PREFECT_API_URL": self.api, **extra})


def sets(settings: list[str]) -> list[str]:
    return [arg for setting in settings for arg in ("--set", setting)]


def pipeline(way: Way, size: Size) -> dict[str, float]:
    """(1) The whole pipeline on a fresh storage, staging included."""
    from storage.location import Location

    storage = size.work / f"{way.name}-storage"
    run = storage / "runs" / "pipe"
    settings = [f"run.storage={storage}", "run.name=pipe", f"data.source={size.source}", *SETTINGS, *PIPELINE_STEPS]

    def sampler(pid: int) -> Sampler:
        return Sampler(pid, staging=lambda: not (run / "spec.json").exists(), events=metrics_events(Location(str(run))))

    seconds, watch, _ = run_child(
        way, ["-m", "flows.finetune", *sets(settings)], size.env(way, f"{way.name}-cache"), size.work / "log", sampler
    )
    return {
        "pipeline_s": seconds,
        "staging_peak_gb": watch.staging_peak / GB,
        "pipeline_rank_anon_gb": watch.rank_peak("RssAnon"),
        "launch_first_s": watch.seen["first_step"] - watch.seen["spec"],
        # The end-of-training evaluation (last step's line to the final_eval line), then the evaluation stage (the
        # export complete to eval.json: its launch included), as the pipeline ran them.
        "final_eval_s": watch.seen["final_eval"] - watch.seen["step_2"],
        "eval_stage_s": watch.seen["evaluated"] - watch.seen["exported"],
    }


def staged(storage: Path) -> tuple[dict[str, Any], str, int]:
    """The dataset the pipeline staged (its reference), the tiny model it built, the shards' bytes."""
    import blake3

    [manifest] = storage.glob("datasets/ds-*/manifest.json")
    [model] = storage.glob("models/tiny-*")
    doc = json.loads(manifest.read_text())
    ref: dict[str, Any] = {"dataset_id": manifest.parent.name, "url": str(manifest.parent)}
    ref["manifest_digest"] = blake3.blake3(manifest.read_bytes()).hexdigest()
    ref["split_records"] = {split: counts.get("rows", counts["records"]) for split, counts in doc["splits"].items()}
    return ref, str(model), sum(f["size"] for f in doc["files"] if f["path"].startswith(("train/", "eval/")))


def launch(way: Way, size: Size, root: str, options: dict[str, str], name: str, cache: str, steps: int) -> Any:
    """(2) A training launch of `steps` steps on the staged dataset (at `root`, reached with `options`)."""
    from storage.location import Location

    ref, model, _ = staged(size.work / f"{way.name}-storage")
    if root != str(size.work / f"{way.name}-storage"):
        ref["url"] = f"{root}/datasets/{ref['dataset_id']}"
    settings = [f"run.storage={root}", f"run.name={name}", f"model.name_or_path={model}", *SETTINGS]
    settings += [f"train.max_steps={steps}", *([f"run.storage_options={json.dumps(options)}"] if options else [])]
    run = Location(f"{root}/runs/{name}", options)
    spec = {"settings": settings, "dataset": ref, "name": name, "model": model}
    _, watch, answer = driver(way, "train", spec, size.env(way, cache), size.work / "log", metrics_events(run))
    figures = {
        "launch_s": watch.seen["first_step"] - watch.seen["spec"],
        "rank_anon_gb": watch.rank_peak("RssAnon"),
        "rank_file_gb": watch.rank_peak("RssFile"),
        "launch_final_eval_s": watch.seen["final_eval"] - watch.seen[f"step_{steps}"],
    }
    return figures, answer["spec_url"], run


def step_data_ms(run: Any) -> float | None:
    """The median data_time_s of a run's steps (None: the old way does not log it)."""
    from storage.fs import read_bytes
    from storage.location import join

    lines = [json.loads(line) for line in read_bytes(join(run, "metrics.jsonl")).splitlines() if line.strip()]
    times = [r["data_time_s"] for r in lines if "data_time_s" in r]
    return 1000 * statistics.median(times) if times else None


def local(way: Way, size: Size) -> dict[str, float]:
    """(2) on local storage (the new way: the old one's launch figures are its pipeline's, and its end-of-training
    evaluation of the whole eval split would cost minutes more at 200k records)."""
    figures, _, run = launch(
        way, size, str(size.work / f"{way.name}-storage"), {}, "steps", f"{way.name}-cache", size.steps
    )
    figures["train_data_ms"] = step_data_ms(run)
    return figures


def reader(way: Way, size: Size) -> dict[str, float]:
    """(3) The per-step data time of the way's reader in one process, and the shards' size on storage."""
    ref, _, shard_bytes = staged(size.work / f"{way.name}-storage")
    data = {"url": ref["url"], "steps": size.steps, "cache": str(size.work / f"{way.name}-cache")}
    _, _, answer = driver(way, "data", data, size.env(way, f"{way.name}-cache"), size.work / "log")
    return {
        "data_ms": answer["step_ms"],
        "reader_anon_gb": answer["rss_anon_gb"],
        "open_s": answer["open_s"],
        "shard_gb": shard_bytes / GB,
    }


def on_s3(way: Way, size: Size) -> dict[str, float]:
    """(4) The staged dataset copied to S3, run.storage there: a launch with a cold node cache, then a warm one (the
    old way has no node cache: one launch, reported as cold)."""
    import s3fs

    assert size.s3 is not None
    options = {"endpoint_url": size.s3}
    ref, _, _ = staged(size.work / f"{way.name}-storage")
    root = f"bench-{way.name}-{size.records}"
    fs = s3fs.S3FileSystem(endpoint_url=size.s3, skip_instance_cache=True)
    fs.mkdir(root)
    fs.put(ref["url"], f"{root}/datasets/", recursive=True)
    out = {}
    for name in ("cold", "warm") if way.name == "new" else ("cold",):
        figures, _, _ = launch(way, size, f"s3://{root}", options, f"s3-{name}", f"{way.name}-s3-cache", 2)
        out[f"s3_{name}_launch_s"] = figures["launch_s"]
    fs.rm(root, recursive=True)
    return out


def staging_only(size: Size, kind: str, model: str) -> dict[str, float]:
    """Staging alone (`python -m flows.prepare`, the new way) from the same records as JSON Lines or Parquet."""
    source = convert(size.source, kind)
    storage = size.work / f"stage-{kind}"
    args = ["-m", "flows.prepare", "--data", str(source), "--storage", str(storage)]
    args += sets([f"model.name_or_path={model}", *SETTINGS])
    way = Way("new", ROOT)
    seconds, watch, _ = run_child(
        way, args, size.env(way, "stage-cache"), size.work / "log", lambda pid: Sampler(pid, staging=lambda: True)
    )
    source.unlink()
    shutil.rmtree(storage, ignore_errors=True)
    return {f"stage_{kind}_s": seconds, f"stage_{kind}_peak_gb": watch.staging_peak / GB}


def measure(way: Way, size: Size) -> dict[str, float]:
    """Every figure of one way at one size."""
    figures = pipeline(way, size)
    print(f"{size.records} records, {way.name}: pipeline {figures['pipeline_s']:.0f} s", flush=True)
    if way.name == "new":
        figures.update(local(way, size))
    figures.update(reader(way, size))
    if size.s3 and (way.name == "new" or size.records <= size.old_s3_max):
        figures.update(on_s3(way, size))
    figures["eval_s"] = figures["final_eval_s"] + figures["eval_stage_s"]
    shown = {key: round(value, 3) for key, value in figures.items() if value is not None}
    print(f"{size.records} records, {way.name}: {json.dumps(shown)}", flush=True)
    return figures


# ------------------------------------------------------------------------------------------------- the report

ROWS = (
    ("pipeline_s", "whole pipeline (2 steps), s", "{:.0f}"),
    ("staging_peak_gb", "staging peak RssAnon (JSON array), GB", "{:.2f}"),
    ("stage_jsonl_peak_gb", "staging peak RssAnon (JSON Lines), GB", "{:.2f}"),
    ("stage_parquet_peak_gb", "staging peak RssAnon (Parquet), GB", "{:.2f}"),
    ("pipeline_rank_anon_gb", "rank peak RssAnon in the pipeline, GB", "{:.2f}"),
    ("rank_anon_gb", "rank peak RssAnon, launch of N steps, GB", "{:.2f}"),
    ("rank_file_gb", "rank peak RssFile (mapped, page cache), GB", "{:.2f}"),
    ("launch_first_s", "launch to first step, first launch, s", "{:.1f}"),
    ("launch_s", "launch to first step, a later launch, s", "{:.1f}"),
    ("s3_cold_launch_s", "launch to first step, S3, cold node cache, s", "{:.1f}"),
    ("s3_warm_launch_s", "launch to first step, S3, warm node cache, s", "{:.1f}"),
    ("data_ms", "data time per step (one process, median), ms", "{:.2f}"),
    ("train_data_ms", "data time per step (metrics.jsonl, median), ms", "{:.2f}"),
    ("reader_anon_gb", "reader process RssAnon, split open, GB", "{:.2f}"),
    ("final_eval_s", "end-of-training evaluation (pipeline), s", "{:.1f}"),
    ("eval_stage_s", "evaluation stage (pipeline), s", "{:.1f}"),
    ("eval_s", "evaluation, both (pipeline), s", "{:.1f}"),
    ("launch_final_eval_s", "end-of-training evaluation, launch of N steps, s", "{:.1f}"),
    ("shard_gb", "shards on storage, GB", "{:.3f}"),
)


def table(figures: dict[str, dict[str, float]]) -> str:
    """A markdown table: a row per figure, a column per size and way."""
    columns = list(figures)
    lines = ["| figure | " + " | ".join(columns) + " |", "| --- |" + " ---: |" * len(columns)]
    for key, label, fmt in ROWS:
        cells = [fmt.format(figures[c][key]) if figures[c].get(key) is not None else "" for c in columns]
        if any(cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def goals(figures: dict[str, dict[str, float]], small: int, large: int, middle: int) -> list[str]:
    """The issue's goals, as ratios of this run's figures (where both sides were measured)."""
    out = []

    def ratio(key: str, a: str, b: str, goal: float, what: str, inverse: bool = False) -> None:
        if a in figures and b in figures and figures[a].get(key) and figures[b].get(key):
            value = figures[b][key] / figures[a][key]
            met = value >= goal if inverse else value <= goal
            out.append(
                f"{what}: {value:.2f}x ({'met' if met else 'NOT met'}; goal {'>=' if inverse else '<='} {goal}x)"
            )

    new = lambda n: f"{n} new"  # noqa: E731
    ratio("rank_anon_gb", new(small), new(large), 1.2, f"rank peak RssAnon, {large} vs {small}")
    ratio("launch_first_s", new(small), new(large), 1.5, f"launch to first step (first launch), {large} vs {small}")
    ratio("launch_s", new(small), new(large), 1.5, f"launch to first step (later launch), {large} vs {small}")
    ratio("data_ms", new(small), new(large), 1.2, f"data time per step, {large} vs {small}")
    ratio("pipeline_s", new(small), new(middle), 2.5, f"whole pipeline, {middle} vs {small}")
    ratio("eval_s", f"{middle} old", new(middle), 0.2, f"evaluation at {middle}, new vs old")
    return out


def report(figures: dict[str, dict[str, float]], sizes: list[int]) -> str:
    lines = [table(figures), ""]
    if len(sizes) > 1:
        lines += goals(figures, sizes[0], sizes[-1], sizes[1] if len(sizes) > 2 else sizes[-1])
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------- main


@contextlib.contextmanager
def prefect_api() -> Iterator[str]:
    """The API the pipelines report to: the caller's (PREFECT_API_URL), else Prefect's test server in this process."""
    if os.environ.get("PREFECT_API_URL"):
        yield os.environ["PREFECT_API_URL"]
        return
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # it would try to reach the internet
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield str(PREFECT_API_URL.value())


@contextlib.contextmanager
def s3_endpoint(enabled: bool) -> Iterator[str | None]:
    """moto's S3 server on 127.0.0.1 (its own process: it keeps objects in memory), or None."""
    if not enabled:
        yield None
        return
    from launch.command import free_port

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    saved = dict(os.environ)
    os.environ.update(AWS_CREDENTIALS)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}"], capture_output=True).returncode:
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("moto's S3 server did not start")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.terminate()
        server.wait(timeout=30)


def run(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Every size, each way, then the report."""
    started = time.perf_counter()
    sizes = [int(n) for n in args.records.split(",")]
    work = Path(tempfile.mkdtemp(prefix="tandem-bench-scale-", dir=args.work))
    figures: dict[str, dict[str, float]] = {}
    try:
        ways = [Way("new", ROOT)]
        old = old_tree(args.baseline, work) if args.baseline != "none" else None
        ways += [old] if old else []
        with prefect_api() as api, s3_endpoint(not args.no_s3) as endpoint:
            for records in sizes:
                folder = work / str(records)
                folder.mkdir()
                generate(folder / "data.json", records)
                size = Size(records, folder, folder / "data.json", api, args.steps, endpoint, args.old_s3_max_records)
                for way in ways:
                    if way.name == "new" or records <= args.old_max_records:
                        figures[f"{records} {way.name}"] = measure(way, size)
                model = staged(folder / "new-storage")[1]
                for kind in filter(None, args.formats.split(",")) if records <= args.formats_max_records else ():
                    figures[f"{records} new"].update(staging_only(size, kind, model))
                shutil.rmtree(folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"\n{report(figures, sizes)}\n\n(the benchmark took {(time.perf_counter() - started) / 60:.1f} min)", flush=True
    )
    return figures


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", default=",".join(map(str, SIZES)), help="sizes, comma-separated")
    parser.add_argument("--steps", type=int, default=60, help="steps of the launch that times each step's data")
    parser.add_argument("--no-s3", action="store_true", help="leave out the launches on S3")
    parser.add_argument("--baseline", default=BASELINE, help="the old way's commit ('none': leave it out)")
    parser.add_argument("--old-max-records", type=int, default=200_000, help="the largest size the old way runs")
    parser.add_argument(
        "--old-s3-max-records", type=int, default=20_000, help="the largest size the old way launches on S3 at"
    )
    parser.add_argument("--formats", default="jsonl,parquet", help="staging alone from these formats too")
    parser.add_argument(
        "--formats-max-records", type=int, default=SIZES[-1], help="the largest size staged alone from --formats"
    )
    parser.add_argument("--work", default=None, help="the folder for the data, storage and caches (default: /tmp)")
    parser.add_argument("--out", default=None, help="write the figures as JSON there")
    parser.add_argument("--driver", choices=sorted(ACTIONS), help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.driver:  # inside a way's tree: its code first on the path
        sys.path.insert(0, args.tree)
        print(json.dumps(ACTIONS[args.driver](json.loads(args.spec))), flush=True)
        return {}
    sys.path.insert(0, str(ROOT))
    figures = run(args)
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1))
    return figures


def test_data_scale() -> None:
    """On demand (not in the default run): the full sizes; prints the figures."""
    assert main([])


if __name__ == "__main__":
    main()
