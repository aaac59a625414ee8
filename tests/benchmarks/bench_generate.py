"""eval.generate's cost: batched, left-padded generation with the KV cache (trainer/evaluation/generate.py) against one
prompt at
a time, at Qwen2.5-0.5B's shape, and the scoring of the answers (trainer/evaluation/scoring.py) beside it.

    python tests/benchmarks/bench_generate.py                          # 0.5B shape, 32 prompts, 64 new tokens
    python tests/benchmarks/bench_generate.py --records 64 --batch-sizes 1,8,32 --max-new-tokens 128

Random weights (no model can be downloaded here) and prompts of --prompt-len to 2 x --prompt-len random tokens; the
stop token is one the prompts never hold, so nearly every answer runs to --max-new-tokens (the tokens generated are
counted, not assumed). Each batch size is timed --repeats times (median and spread); its ratio is against batch
size 1 in the same run. Memory: the process's peak resident memory after each variant (a GPU's peak allocation on a
GPU). Nothing here asserts: it prints.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SHAPES = {
    "0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14},
    "toy": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4},
}


def build(shape: str, vocab: int) -> tuple[object, object]:
    """A Qwen2 of the shape with random weights, on the GPU when there is one, and its device."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = Qwen2Config(vocab_size=vocab, num_key_value_heads=2, tie_word_embeddings=True, **SHAPES[shape])
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return Qwen2ForCausalLM(config).to(device=device, dtype=dtype).eval(), device


def peak_gb(device: object) -> float:
    """Peak memory so far: the GPU's allocation, else this process's resident memory."""
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def timed(model: object, prompts: list, batch_size: int, max_new_tokens: int, repeats: int) -> dict:
    """Median seconds (and spread) to answer every prompt in batches of `batch_size`, and the tokens generated."""
    from config.sections.results import GenerateConfig
    from trainer.evaluation.generate import batches_of, generate_batch

    cfg = GenerateConfig(enabled=True, max_new_tokens=max_new_tokens, batch_size=batch_size)
    seconds, tokens = [], 0
    for _ in range(repeats):
        started, tokens = time.perf_counter(), 0
        for j, batch in enumerate(batches_of(prompts, batch_size)):
            tokens += sum(len(a) for a in generate_batch(model, batch, cfg, (0, [1]), j))
        seconds.append(time.perf_counter() - started)
    return {"batch_size": batch_size, "seconds": statistics.median(seconds), "spread": max(seconds) - min(seconds)} | {
        "new_tokens": tokens
    }


def scoring_seconds(records: int, words: int) -> float:
    """Seconds to score `records` answers of `words` words against references as long (ROUGE-L dominates)."""
    from trainer.evaluation.scoring import Sums

    answer = " ".join(f"w{i % 50}" for i in range(words))
    reference = " ".join(f"w{i % 37}" for i in range(words))
    started, sums = time.perf_counter(), Sums()
    for _ in range(records):
        sums.add("prompt", reference, answer, None)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> list[dict]:
    """The script's entry point; returns one row per batch size, as printed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--records", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args(argv)
    import torch

    model, device = build(options.shape, options.vocab)
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(options.prompt_len, 2 * options.prompt_len + 1, (options.records,), generator=generator)
    prompts = [
        (i, torch.randint(2, options.vocab, (int(n),), generator=generator).tolist(), [2])
        for i, n in enumerate(lengths)
    ]
    rows = []
    for size in (int(s) for s in options.batch_sizes.split(",")):
        row = timed(model, prompts, size, options.max_new_tokens, options.repeats) | {"peak_gb": peak_gb(device)}
        row["ratio_to_batch_1"] = rows[0]["seconds"] / row["seconds"] if rows else 1.0
        rows.append(row)
        print(
            f"batch {size:>3}: {options.records} prompts x {row['new_tokens'] // options.records} new tokens in "
            f"{row['seconds']:.2f} s (spread {row['spread']:.2f}, {row['new_tokens'] / row['seconds']:.0f} tokens/s, "
            f"x{row['ratio_to_batch_1']:.2f} of batch 1), peak {row['peak_gb']:.2f} GB on {device}",
            flush=True,
        )
    score = scoring_seconds(options.records, options.max_new_tokens)
    print(f"scoring {options.records} answers of {options.max_new_tokens} words: {score:.4f} s", flush=True)
    rows[0]["scoring_seconds"] = score
    return rows


if __name__ == "__main__":
    main()
