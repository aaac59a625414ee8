"""What the reference model of DPO costs: a LoRA step with the reference pass (the same model, adapters disabled, no
gradients) against the same step without it (ORPO's, which has no reference), in time and peak memory; with
`--method full`, full fine-tuning's DPO step, which looks its reference up in the table the base computed before
training (trainer/objectives/preference/reference_table.py), against ORPO's, and the time that table took per pair.

    python tests/benchmarks/bench_preference_reference.py                      # 4 pairs x 512 tokens, 4 layers
    python tests/benchmarks/bench_preference_reference.py --pairs 8 --seq 1024 --layers 8 --hidden 1024
    python tests/benchmarks/bench_preference_reference.py --method full

One micro-batch of pairs (chosen and rejected in one forward pass) through the objective's `micro_batch`
(trainer/objectives/preference/) and a backward pass, on a random Qwen2-shaped model with LoRA (trainer/model/load.py
`make_trainable`), float32 on a CPU, bfloat16 on a GPU. Each objective runs in a fresh process: `--repeats` timed steps
after one warm-up step (the median is reported), then the peak memory the step added (GPU:
torch.cuda.max_memory_allocated above what was allocated before; CPU: the peak resident memory above the resident memory
before, a lower bound). The figure that matters is the ratio, dpo over orpo, measured in the same run. Nothing here
asserts: it prints.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

VOCAB = 32000


def resident_gb() -> float:
    """This process's resident memory now."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**30


class Rows(list):
    """The benchmark's pairs as the reference table reads a split: rows by index, each one's feedback."""

    def feedback(self, index: int) -> int:
        return -1  # a pair


def reference_table(model, rows: Rows, device) -> tuple[object, float]:
    """(full fine-tuning's reference table of `rows`, the seconds the base took to compute it)."""
    import numpy as np

    from trainer.objectives.preference.reference_table import ReferenceTable, compute
    from trainer.parallel.distributed import Dist

    dist = Dist(rank=0, local_rank=0, world_size=1, node_rank=0, host="bench", device=device)
    started = time.perf_counter()
    values = np.zeros((len(rows), 2))  # the table rank 0 fills (in a run: a mapped .npy file)
    compute(model, rows, dist, values, batch_size=len(rows), pad_id=0, lockstep=False)
    return ReferenceTable(values), time.perf_counter() - started


def one(objective: str, pairs: int, seq: int, layers: int, hidden: int, repeats: int, method: str = "lora") -> dict:
    """Measure one objective in this process."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from config.sections.model_train import TrainConfig
    from storage.shards import IGNORE_INDEX, Row
    from trainer.model.adapters import make_trainable
    from trainer.objectives.preference.batching import collate_preference
    from trainer.objectives.registry import build
    from trainer.parallel.distributed import Dist

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 1),
        num_key_value_heads=max(hidden // 128, 1),
    )
    base = Qwen2ForCausalLM(config).to(device=device, dtype=torch.bfloat16 if cuda else torch.float32)
    train = TrainConfig.model_validate({"method": method, "objective": objective, "lora": {"dropout": 0.0}})
    model = make_trainable(base, train)
    prompt, answer = seq // 2, seq // 2
    rows = Rows()
    for _ in range(pairs):
        ids = torch.randint(2, VOCAB, (prompt + 2 * answer,)).tolist()
        rows.append(Row(ids, [IGNORE_INDEX] * prompt + ids[prompt:], [prompt, answer, answer]))
    batch = collate_preference(rows, [-1] * pairs, 0, indices=range(pairs))
    chosen = build(train)
    table, table_s = None, 0.0
    if method == "full" and chosen.objective.reference:
        table, table_s = reference_table(model.eval(), rows, device)
        chosen.tables = {"train": table}  # type: ignore[attr-defined]  # as PreferenceObjective.start reads it
        model.train()
    dist = Dist(rank=0, local_rank=0, world_size=1, node_rank=0, host="bench", device=device)
    scope = chosen.begin_step(model, [batch], dist)

    def step() -> float:
        started = time.perf_counter()
        chosen.micro_batch(model, batch, scope).backward.backward()
        model.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - started

    step()  # warm-up
    if cuda:
        before = torch.cuda.memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
    else:
        before = resident_gb()
    seconds = [step() for _ in range(repeats)]
    if cuda:
        peak = torch.cuda.max_memory_allocated() / 2**30
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    return {
        "objective": objective,
        "method": method,
        "reference_table_s_per_pair": table_s / pairs if table is not None else None,
        "pairs": pairs,
        "seq": seq,
        "device": str(device),
        "step_s": statistics.median(seconds),
        "peak_added_gb": round(max(peak - before, 0.0), 3),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    """The script's entry point: each objective in a child process; returns their figures as printed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--seq", type=int, default=512, help="tokens of prompt + one answer")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--method", choices=["lora", "full"], default="lora")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child process of one objective
    options = parser.parse_args(argv)
    shape = [options.pairs, options.seq, options.layers, options.hidden, options.repeats, options.method]
    if options.one is not None:
        print(json.dumps(one(options.one, *shape)))
        return []
    rows = []
    for objective in ("orpo", "dpo"):
        args = ["--pairs", "--seq", "--layers", "--hidden", "--repeats", "--method"]
        command = [sys.executable, __file__, "--one", objective]
        command += [part for flag, value in zip(args, shape, strict=True) for part in (flag, str(value))]
        out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(
            f"{objective:<5} {options.pairs} pairs x {options.seq} tokens on {rows[-1]['device']}: step "
            f"{rows[-1]['step_s']:.3f} s, peak added {rows[-1]['peak_added_gb']:.3f} GB",
            flush=True,
        )
    ratio = rows[1]["step_s"] / rows[0]["step_s"]
    if options.method == "full":
        per_pair = rows[1]["reference_table_s_per_pair"]
        print(
            f"full fine-tuning: dpo's step (its reference looked up) takes {ratio:.2f} x orpo's; the table took "
            f"{per_pair:.3f} s per pair, once, before training ({per_pair * options.pairs / rows[1]['step_s']:.2f} x "
            "a step over the same pairs)",
            flush=True,
        )
        return rows
    print(f"the reference pass: dpo's step takes {ratio:.2f} x orpo's (no reference)", flush=True)
    return rows


if __name__ == "__main__":
    main()
