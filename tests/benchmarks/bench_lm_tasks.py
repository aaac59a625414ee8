"""eval.tasks' cost: an lm-evaluation-harness multiple-choice task run through trainer/evaluation/lm_tasks.py (the
harness's HF
backend on the model in memory) at Qwen2.5-0.5B's shape, at several request batch sizes (eval.tasks.batch_size).

    python tests/benchmarks/bench_lm_tasks.py                        # 0.5B shape, 32 documents x 4 choices
    python tests/benchmarks/bench_lm_tasks.py --documents 64 --batch-sizes 1,8,32

Random weights (no model can be downloaded here) and Qwen's real tokenizer; the task is written as a user writes one
(a local JSON Lines file and a task YAML, eval.tasks.include_path), each document a question of about --words words
with 4 answers of a few words, so each document costs 4 log-likelihood requests. Each batch size is timed --repeats
times (median and spread), the ratio against batch size 1 in the same run; the accuracy must be the same at every
batch size (the same requests, padded differently). Memory: the process's peak resident memory after each variant (a
GPU's peak allocation on a GPU). Nothing here asserts: it prints.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_generate import SHAPES, build, peak_gb

TASK = "bench_choice"
WORDS = [
    "river",
    "stone",
    "light",
    "garden",
    "window",
    "market",
    "silver",
    "morning",
    "engine",
    "paper",
    "forest",
    "signal",
    "winter",
    "harbor",
]


def write_task(directory: Path, documents: int, words: int) -> Path:
    """A multiple-choice task of `documents` questions, 4 answers each, as a user writes one."""
    rng = random.Random(0)
    rows = [
        {
            "question": " ".join(rng.choice(WORDS) for _ in range(words)),
            "choices": [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5))) for _ in range(4)],
            "answer": rng.randrange(4),
        }
        for _ in range(documents)
    ]
    data = directory / "questions.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (directory / f"{TASK}.yaml").write_text(
        f"task: {TASK}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
        'output_type: multiple_choice\ndoc_to_text: "Question: {{question}}\\nAnswer:"\ndoc_to_choice: choices\n'
        "doc_to_target: answer\nmetric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )
    return directory


def main(argv: list[str] | None = None) -> list[dict]:
    """The script's entry point; returns one row per batch size, as printed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument("--documents", type=int, default=32)
    parser.add_argument("--words", type=int, default=24)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args(argv)
    import torch

    from config.lm_tasks import task_manager
    from config.sections.results import TasksConfig
    from trainer.evaluation.lm_tasks import run_tasks
    from trainer.model.tiny_qwen import build_qwen25_tokenizer
    from trainer.parallel.distributed import Dist

    tokenizer = build_qwen25_tokenizer()
    model, device = build(options.shape, len(tokenizer))
    dist = Dist(rank=0, local_rank=0, world_size=1, node_rank=0, host="bench", device=torch.device(str(device)))
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as scratch:
        tasks = write_task(Path(scratch), options.documents, options.words)
        for size in (int(s) for s in options.batch_sizes.split(",")):
            cfg = TasksConfig(names=[TASK], include_path=str(tasks), batch_size=size, bootstrap_iters=0)
            manager = task_manager(cfg)
            seconds, accuracy = [], None
            for _ in range(options.repeats):
                started = time.perf_counter()
                accuracy = run_tasks(model, tokenizer, cfg, manager, dist, seed=0)["tasks"][TASK]["acc"]
                seconds.append(time.perf_counter() - started)
            median = statistics.median(seconds)
            row = {
                "batch_size": size,
                "seconds": median,
                "spread": max(seconds) - min(seconds),
                "requests_per_s": 4 * options.documents / median,
                "acc": accuracy,
                "peak_gb": peak_gb(device),
            }
            row["ratio_to_batch_1"] = rows[0]["seconds"] / median if rows else 1.0
            rows.append(row)
            print(
                f"batch {size:>3}: {options.documents} documents x 4 choices in {median:.2f} s (spread "
                f"{row['spread']:.2f}, {row['requests_per_s']:.1f} requests/s, x{row['ratio_to_batch_1']:.2f} of "
                f"batch 1), acc {accuracy:.4f}, peak {row['peak_gb']:.2f} GB on {device}",
                flush=True,
            )
    return rows


if __name__ == "__main__":
    main()
