"""Benchmarks of the prepare step, run on demand (not collected by the default pytest run):

    .venv/bin/python -m pytest tests/benchmarks/bench_prepare.py -s          # BENCH_GB, BENCH_REPEATS env
    .venv/bin/python tests/benchmarks/bench_prepare.py --gb 1.0 --repeats 3
    .venv/bin/python tests/benchmarks/bench_prepare.py --gb 0.02 --repeats 3  # a quick look on a busy machine

It generates a JSONL of about --gb gigabytes (Qwen `conversations`, the sample's vocabulary, 1-3 exchanges
per record) in a temporary folder and prints medians of --repeats runs and their ratios, all measured in
this run on this machine, with --num-proc processes on both sides:

(a) staging the file to a local folder (everything `stage_dataset` does: digest the source, read and validate,
    tokenize with the chat template, write and digest the shards, manifest) vs the workflow it replaces: `cp`
    then `sha256sum` of the file, then `datasets` loading the copy, applying the same chat template with the
    same tokenizer and num_proc (`map`, token ids only, no labels) and writing Parquet;
(b) the staging's I/O and digest path alone vs `cp` + `sha256sum`: the source read and digested once (what
    replaces the copy and the checksum; `digest_sources`, interleaved with them). Beside it, from the staging's
    own log: writing and digesting the shards (Arrow IPC, the counterpart of the workflow's to_parquet),
    parsing and validating every record (Python), and everything but tokenizing as a second ratio;
(c) staging the unchanged input again vs the first staging (and again without the by-source index);
(e) tokenization throughput (records/s, labels included) vs that `datasets.map`, on the first --tokenize-mb
    megabytes of the file;
(f) the first pass alone (read, validate, digest, spool: `scan_sources`) in --num-proc processes vs in one.
(d), training tokens/s packed vs length-grouped, is `tests/benchmarks/bench_train.py --parts packing`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from config.sections.run_data import DataConfig
from staging.stage import stage_dataset
from storage.location import Location

SAMPLE = ROOT / "data" / "sample" / "conversations.json"


def generate(path: Path, target_bytes: int, seed: int = 0) -> int:
    """A JSONL of about target_bytes: conversations recombined from the sample's exchanges. Returns records."""
    rng = random.Random(seed)
    exchanges = []
    for record in json.loads(SAMPLE.read_text()):
        turns = [t for t in record["conversations"] if t["from"] != "system"]
        exchanges += [turns[i : i + 2] for i in range(0, len(turns) - 1, 2)]
    systems = [None, None, {"from": "system", "value": "You are a careful assistant. Answer briefly."}]
    written = count = 0
    with open(path, "w", encoding="utf-8") as handle:
        while written < target_bytes:
            turns = [s for s in [rng.choice(systems)] if s]
            for _ in range(rng.choice((1, 1, 2, 3))):
                turns += rng.choice(exchanges)
            line = json.dumps({"id": f"gen-{count:08d}", "n": rng.random(), "conversations": turns}) + "\n"
            handle.write(line)
            written += len(line)
            count += 1
    return count


def timed(fn: Callable[[], object]) -> float:
    """Seconds `fn` took."""
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def median(values: list[float]) -> float:
    """The median of `values`."""
    return statistics.median(values)


def phase_seconds(messages: list[str]) -> dict[str, float]:
    """Seconds per phase from the staging log ('reading: 1.0 GB in 12.3 s', '... written in 4.5 s')."""
    out = {}
    for message in messages:
        if match := re.match(r"^(digesting sources|reading|tokenizing): .*? in ([0-9.]+) s", message):
            out[match[1]] = float(match[2])
        if match := re.search(r"shards \(.*\) (?:written|uploaded) in ([0-9.]+) s", message):
            out["writing"] = float(match[1])
    return out


def replaced_workflow(source: Path, target: Path, model: str, num_proc: int) -> float:
    """Seconds of what staging replaces: cp + sha256sum, then datasets loads the copy, applies the chat template
    (token ids) in num_proc processes and writes Parquet."""
    from datasets import Dataset, disable_progress_bars

    from staging.tokenizer import load_tokenizer

    disable_progress_bars()
    tokenizer = load_tokenizer(model)
    roles = {"system": "system", "user": "user", "assistant": "assistant"}

    def template(batch: dict) -> dict:
        messages = [
            [{"role": roles[t["from"]], "content": t["value"]} for t in turns] for turns in batch["conversations"]
        ]
        return {"input_ids": tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)}

    def workflow() -> None:
        copy = target / source.name
        subprocess.run(f"cp '{source}' '{target}/' && sha256sum '{copy}' > /dev/null", shell=True, check=True)
        dataset = Dataset.from_json(str(copy), cache_dir=str(target / "hf-cache"))
        dataset = dataset.map(
            template, batched=True, num_proc=num_proc, remove_columns=dataset.column_names, load_from_cache_file=False
        )
        dataset.to_parquet(str(target / "tokenized.parquet"))

    target.mkdir()
    try:
        return timed(workflow)
    finally:
        shutil.rmtree(target)


def bench_staging(
    source: Path, work: Path, model: str, repeats: int, stage_repeats: int, num_proc: int
) -> dict[str, float]:
    """(a), (b) and (c)."""
    from staging.identity import digest_sources
    from staging.progress import Reporter

    data = DataConfig(source=str(source), max_length=4096, num_proc=num_proc)
    baseline, digests, replaced = [], [], []
    for i in range(repeats):  # interleaved: a change in the machine's load hits both alike
        target = work / f"copy-{i}"
        target.mkdir()
        baseline.append(
            timed(
                lambda target=target: subprocess.run(
                    f"cp '{source}' '{target}/' && sha256sum '{target / source.name}' > /dev/null",
                    shell=True,
                    check=True,
                )
            )
        )
        shutil.rmtree(target)
        digests.append(
            timed(
                lambda: digest_sources(
                    [("data.source", Location(str(source)))],
                    data.digest_algorithm,
                    Reporter(lambda _: None, bars=False),
                )
            )
        )
    for i in range(stage_repeats):
        replaced.append(replaced_workflow(source, work / f"workflow-{i}", model, num_proc))
    first, phases = [], []
    for i in range(stage_repeats):
        storage = work / f"storage-{i}"
        shutil.rmtree(work / f"storage-{i - 1}", ignore_errors=True)
        messages: list[str] = []
        first.append(
            timed(
                lambda storage=storage, messages=messages: stage_dataset(
                    data, Location(str(storage)), model, progress=messages.append, bars=False
                )
            )
        )
        phases.append(phase_seconds(messages))
    again, no_index = [], []
    for _ in range(repeats):
        again.append(
            timed(lambda: stage_dataset(data, Location(str(storage)), model, progress=lambda _: None, bars=False))
        )
    for _ in range(repeats):
        shutil.rmtree(storage / "datasets" / "by-source")
        no_index.append(
            timed(lambda: stage_dataset(data, Location(str(storage)), model, progress=lambda _: None, bars=False))
        )
    shutil.rmtree(storage)
    writing = median([p["writing"] for p in phases])
    return {
        "cp_sha256sum_s": median(baseline),
        "replaced_workflow_s": median(replaced),
        "stage_first_s": median(first),
        "digest_s": median(digests),
        "writing_s": writing,
        "digest_algorithm": data.digest_algorithm,
        "parsing_s": median([p["reading"] for p in phases]),
        "untokenized_s": median(digests) + median([p["reading"] + p["writing"] for p in phases]),
        "tokenizing_s": median([p["tokenizing"] for p in phases]),
        "stage_again_s": median(again),
        "stage_again_without_index_s": median(no_index),
        "stage_repeats": stage_repeats,
        "repeats": repeats,
        "num_proc": num_proc,
    }


def bench_tokenize(
    source: Path, work: Path, model: str, megabytes: int, num_proc: int, repeats: int
) -> dict[str, float]:
    """(c): records per second, ours (ids and labels) vs datasets.map (ids only)."""
    from datasets import Dataset, disable_progress_bars

    from staging.progress import Reporter
    from staging.scan import scan_sources
    from staging.spool import read_chunk
    from staging.tokenize import EncoderSettings
    from staging.tokenizer import load_tokenizer
    from staging.workers import encode_chunks, worker_count

    subset = work / "subset.jsonl"
    with open(source, "rb") as src, open(subset, "wb") as dst:
        for line in src:
            if dst.tell() >= megabytes * 10**6:
                break
            dst.write(line)
    data = DataConfig(source=str(subset), max_length=4096, eval_ratio=0.0)
    spool = work / "records.spool"
    scan = scan_sources(first_pass_inputs(subset, data), data, spool, Reporter(lambda _: None, bars=False))
    conversations = [conv for chunk in scan.chunks for _, conv in read_chunk(spool, chunk)]
    workers = worker_count(num_proc, len(scan.chunks))
    disable_progress_bars()
    tokenizer = load_tokenizer(model)
    dataset = Dataset.from_list([{"messages": c["messages"]} for c in conversations])

    def template(batch: dict) -> dict:
        return {"input_ids": tokenizer.apply_chat_template(batch["messages"], tokenize=True, return_dict=False)}

    ours, theirs = [], []
    for _ in range(repeats):  # interleaved, so that a change in the machine's load hits both sides alike
        ours.append(
            timed(lambda: list(encode_chunks(spool, scan.chunks, EncoderSettings(model, data.max_length), workers)))
        )
        theirs.append(
            timed(
                lambda: dataset.map(
                    template, batched=True, num_proc=num_proc, load_from_cache_file=False, remove_columns=["messages"]
                )
            )
        )
    n = len(conversations)
    return {
        "records": n,
        "mb": subset.stat().st_size / 1e6,
        "workers": workers,
        "repeats": repeats,
        "ours_records_per_s": n / median(ours),
        "datasets_map_records_per_s": n / median(theirs),
    }


def first_pass_inputs(path: Path, data: DataConfig) -> Any:
    """What pass one reads for data.source = one local file (its digest and the source key left out)."""
    from staging.identity import Inputs, SourceFile
    from staging.streams import resolve

    return Inputs([SourceFile("data.source", Location(str(path)), path.stat().st_size, "-")], {}, "-", resolve(data))


def bench_first_pass(source: Path, work: Path, num_proc: int, repeats: int) -> dict[str, float]:
    """(f): seconds of pass one over the whole file, in one process and in num_proc (interleaved)."""
    from staging.progress import Reporter
    from staging.scan import scan_sources

    seconds: dict[int, list[float]] = {1: [], num_proc: []}
    for _ in range(repeats):
        for processes in seconds:
            data = DataConfig(source=str(source), num_proc=processes)
            inputs = first_pass_inputs(source, data)
            seconds[processes].append(
                timed(
                    lambda inputs=inputs, data=data: scan_sources(
                        inputs, data, work / "pass.spool", Reporter(lambda _: None, bars=False)
                    )
                )
            )
    return {
        "mb": source.stat().st_size / 1e6,
        "num_proc": num_proc,
        "repeats": repeats,
        "one_s": median(seconds[1]),
        "many_s": median(seconds[num_proc]),
    }


def report(
    size: int,
    records: int,
    staging: dict[str, float] | None,
    tokenize: dict[str, float] | None,
    first_pass: dict[str, float] | None = None,
) -> str:
    """The printed report of the parts measured."""
    lines = [f"input: {size / 1e9:.2f} GB JSONL, {records:,} records; {os.cpu_count()} cores"]
    if staging:
        s = staging
        lines += [
            f"medians of {s['repeats']} runs ({s['stage_repeats']} for a first staging and the workflow), "
            f"num_proc={s['num_proc']}",
            "(a) staging vs cp + sha256sum + datasets.map (chat template) + to_parquet (goal: >= 1.5x faster)",
            f"    cp + sha256sum + datasets {s['replaced_workflow_s']:8.1f} s",
            f"    stage (all of it)         {s['stage_first_s']:8.1f} s   speed-up "
            f"{s['replaced_workflow_s'] / s['stage_first_s']:.2f}x",
            f"      of which tokenizing     {s['tokenizing_s']:8.1f} s",
            "(b) the I/O and digest path alone vs cp + sha256sum (goal: >= 1.5x faster)",
            f"    cp + sha256sum            {s['cp_sha256sum_s']:8.2f} s",
            f"    source read + digested    {s['digest_s']:8.2f} s   speed-up "
            f"{s['cp_sha256sum_s'] / s['digest_s']:.2f}x   (once, {s['digest_algorithm']}: what replaces them)",
            f"    shards written + digested {s['writing_s']:8.2f} s   (Arrow IPC: the counterpart of the "
            "workflow's to_parquet, in (a))",
            f"    parsing and validating    {s['parsing_s']:8.2f} s   (every record, in Python; not I/O)",
            f"    all but tokenizing        {s['untokenized_s']:8.2f} s   speed-up "
            f"{s['cp_sha256sum_s'] / s['untokenized_s']:.2f}x   (the three above)",
            "(c) re-staging unchanged input vs first staging (goal: < 5%)",
            f"    again                     {s['stage_again_s']:8.2f} s   = "
            f"{100 * s['stage_again_s'] / s['stage_first_s']:.2f}%",
            f"    again, no by-source index {s['stage_again_without_index_s']:8.2f} s   = "
            f"{100 * s['stage_again_without_index_s'] / s['stage_first_s']:.2f}%",
        ]
    if tokenize:
        t = tokenize
        lines += [
            f"(e) tokenization throughput vs datasets.map, {t['records']:,} records ({t['mb']:.0f} MB), "
            f"num_proc={t['workers']}, medians of {t['repeats']} interleaved runs (goal: >= 1.0x)",
            f"    ours (ids + labels)       {t['ours_records_per_s']:8.0f} records/s",
            f"    datasets.map (ids)        {t['datasets_map_records_per_s']:8.0f} records/s   ratio "
            f"{t['ours_records_per_s'] / t['datasets_map_records_per_s']:.2f}x",
        ]
    if first_pass:
        f = first_pass
        lines += [
            f"(f) the first pass (read, validate, digest, spool), {f['mb']:.0f} MB, medians of {f['repeats']} "
            "interleaved runs",
            f"    1 process                 {f['one_s']:8.2f} s   {f['mb'] / f['one_s']:6.1f} MB/s",
            f"    {f['num_proc']} processes               {f['many_s']:8.2f} s   {f['mb'] / f['many_s']:6.1f} MB/s   "
            f"speed-up {f['one_s'] / f['many_s']:.2f}x",
        ]
    return "\n".join(lines)


def run(
    gb: float,
    repeats: int,
    stage_repeats: int,
    tokenize_mb: int,
    num_proc: int,
    model: str | None,
    tmp: Path,
    parts: str = "abcef",
) -> str:
    """Generate the input, run (a), (b), (c) (they share the staging runs), (e) and (f); returns the printed
    report."""
    if model is None:
        model = str(tmp / "tiny")
        subprocess.run(
            [sys.executable, "-m", "trainer.model.tiny", "--out", model, "--corpus", str(SAMPLE)],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
    source = tmp / "input.jsonl"
    records = generate(source, int(gb * 1e9) if parts != "e" else tokenize_mb * 10**6 * 11 // 10)
    staging = bench_staging(source, tmp, model, repeats, stage_repeats, num_proc) if "a" in parts else None
    tokenize = bench_tokenize(source, tmp, model, tokenize_mb, num_proc, repeats) if "e" in parts else None
    first_pass = bench_first_pass(source, tmp, num_proc, repeats) if "f" in parts else None
    text = report(source.stat().st_size, records, staging, tokenize, first_pass)
    print(f"\n{text}\n", flush=True)
    return text


def test_bench_prepare(tiny_model: str, tmp_path: Path) -> None:
    """The benchmark under pytest (`-s` shows the report); BENCH_GB, BENCH_REPEATS, BENCH_STAGE_REPEATS,
    BENCH_TOKENIZE_MB and BENCH_PARTS (abcef, abc, e or f) set what the script's options set."""
    repeats = int(os.environ.get("BENCH_REPEATS", "3"))
    run(
        float(os.environ.get("BENCH_GB", "1.0")),
        repeats,
        int(os.environ.get("BENCH_STAGE_REPEATS", repeats)),
        int(os.environ.get("BENCH_TOKENIZE_MB", "50")),
        2,
        tiny_model,
        tmp_path,
        os.environ.get("BENCH_PARTS", "abcef"),
    )


def main(argv: list[str] | None = None) -> str:
    """Script entry point; returns the printed report."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.0, help="size of the generated JSONL (default 1.0)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement; medians are printed")
    parser.add_argument(
        "--stage-repeats",
        type=int,
        default=None,
        help="first stagings and replaced workflows for (a)/(b) (default: --repeats; each takes "
        "minutes per GB on 2 cores)",
    )
    parser.add_argument("--tokenize-mb", type=int, default=50, help="input size for (c) (default 50)")
    parser.add_argument("--num-proc", type=int, default=2, help="processes, both sides (default 2)")
    parser.add_argument(
        "--parts",
        choices=("abcef", "abc", "e", "f"),
        default="abcef",
        help="which measurements: (a), (b), (c) share the staging runs; (e) and (f) are separate",
    )
    parser.add_argument("--tmp", type=Path, default=None, help="work folder (default: a new one in $TMPDIR)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tandem-bench-", dir=args.tmp) as tmp:
        return run(
            args.gb,
            args.repeats,
            args.stage_repeats or args.repeats,
            args.tokenize_mb,
            args.num_proc,
            None,
            Path(tmp),
            args.parts,
        )


if __name__ == "__main__":
    main()
