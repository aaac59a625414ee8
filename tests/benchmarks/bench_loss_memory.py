"""Peak memory of the loss alone at Qwen2.5's vocabulary: full logits vs chunks of train.loss_chunk_tokens.

    python tests/benchmarks/bench_loss_memory.py                        # 1 x 2,048 tokens, chunks 0 (full) and 1024
    python tests/benchmarks/bench_loss_memory.py --rows 2 --seq 2048 --chunks 0,4096,1024,256
    python tests/benchmarks/bench_loss_memory.py --logps --rows 4 --seq 1024 --repeats 3   # 2 pairs, DPO's path

`--logps` takes each row's log-probability instead (what DPO, IPO, KTO and ORPO compare: trainer/loss/logps.py from
full logits, LossHead.sequence_logps from the hidden states), its backward through a DPO-like weighting of the rows.
`--repeats` times the forward and backward that many times in each variant's process and prints the median and the
spread (min..max) of the seconds; the peak is the largest over the repeats.

One forward and backward of a one-layer Qwen2 (hidden 256) with a 151,936-row output layer, every position but the
first a target, through trainer/loss/chunked.py's LossHead, each variant in a fresh process (a variant with chunks
takes them only where the target logits exceed the one-pass threshold, 256 MiB: from 442 target tokens at this
vocabulary; each line says which it took). Reported: the peak
memory the step added, on a GPU torch.cuda.max_memory_allocated above what was allocated before the forward, on a
CPU the process's peak resident memory above its resident memory before the forward (a lower bound when importing
peaked higher). Nothing here asserts: it prints.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

VOCAB = 151936
HIDDEN = 256


def resident_gb() -> float:
    """This process's resident memory now."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**30


def one(chunk: int, rows: int, seq: int, *, logps: bool = False, repeats: int = 1) -> dict:
    """Measure one variant in this process."""
    import statistics
    import time

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trainer.loss.chunked import LossHead

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=512,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config).to(device=device, dtype=torch.bfloat16 if cuda else torch.float32)
    ids = torch.randint(0, VOCAB, (rows, seq), device=device)
    head = LossHead.of(model, chunk)
    if cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
    else:
        before = resident_gb()
    seconds = []
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        out = model(input_ids=ids, **head.forward_kwargs(device))
        if logps:  # chosen rows first, then rejected: a DPO-like margin, so every row's gradient is used
            values, _ = head.sequence_logps(out, ids)
            loss = -torch.nn.functional.logsigmoid(0.1 * (values[: rows // 2].sum() - values[rows // 2 :].sum()))
        else:
            loss = head.summed(out, ids)
        loss.backward()
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**30
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    return {
        "loss_chunk_tokens": chunk,
        "rows": rows,
        "seq": seq,
        "device": str(device),
        "peak_added_gb": round(peak - before, 3),
        "loss": float(loss),
        "chunked": head.head is not None and not head.fits(rows * (seq - 1)),
        "what": "logps" if logps else "loss",
        "seconds_median": round(statistics.median(seconds), 3),
        "seconds_spread": [round(min(seconds), 3), round(max(seconds), 3)],
    }


def main(argv: list[str] | None = None) -> list[dict]:
    """The script's entry point: each variant in a child process; returns their figures as printed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--chunks", default="0,1024", help="train.loss_chunk_tokens values (0: full logits)")
    parser.add_argument("--logps", action="store_true", help="each row's log-probability (preference objectives)")
    parser.add_argument("--repeats", type=int, default=1, help="forward and backward passes timed per variant")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child process of one variant
    options = parser.parse_args(argv)
    if options.one is not None:
        print(json.dumps(one(options.one, options.rows, options.seq, logps=options.logps, repeats=options.repeats)))
        return []
    shape = ["--rows", str(options.rows), "--seq", str(options.seq), "--repeats", str(options.repeats)]
    extra = [*shape, *(["--logps"] if options.logps else [])]
    rows = []
    for chunk in (int(c) for c in options.chunks.split(",")):
        out = subprocess.run(
            [sys.executable, __file__, "--one", str(chunk), *extra],
            check=True,
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(
            f"loss_chunk_tokens={chunk:<6} {rows[-1]['rows']} x {rows[-1]['seq']} tokens on {rows[-1]['device']}: "
            f"{rows[-1]['what']}: peak added {rows[-1]['peak_added_gb']:.2f} GB, {rows[-1]['seconds_median']:.2f} s "
            f"(spread {rows[-1]['seconds_spread'][0]:.2f}..{rows[-1]['seconds_spread'][1]:.2f}, loss "
            f"{rows[-1]['loss']:.4f}, {'chunked' if rows[-1]['chunked'] else 'one pass'})",
            flush=True,
        )
    return rows


if __name__ == "__main__":
    main()
