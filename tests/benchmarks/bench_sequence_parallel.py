"""Per-rank peak memory and tokens/s of one long row split across 1, 2 and 4 CPU ranks (train.sequence_parallel_size),
LoRA on Qwen2.5-0.5B's shape (its width, 14 heads, 2 key-value heads and 151,936-token vocabulary; `--layers` decoder
layers, 2 by default, so that a step fits a CPU's time).

    .venv/bin/python tests/benchmarks/bench_sequence_parallel.py                        # 8,192 and 16,384 tokens
    .venv/bin/python tests/benchmarks/bench_sequence_parallel.py --lengths 8192 --ranks 1,2
    .venv/bin/python tests/benchmarks/bench_sequence_parallel.py --toy                  # toy size
    MALLOC_MMAP_THRESHOLD_=65536 .venv/bin/python tests/benchmarks/bench_sequence_parallel.py --layers 6 ...

glibc keeps freed blocks under its mmap threshold (which grows to 32 MiB as large blocks are freed) for reuse, and
RssAnon counts them: the split rank's many half-size tensors left more behind than one rank's. With
MALLOC_MMAP_THRESHOLD_ fixed in the environment (the ranks inherit it) every block of that size or more goes back to
the system when freed, so the peaks are those of live memory, as a GPU's allocated bytes are. Each rank copies the
model's weights into its own memory (file pages of the safetensors until written, which RssAnon would miss on one
rank and count on a rank receiving DeepSpeed's broadcast).

Each case is one torchrun launch of `--ranks` ranks on this machine running the trainer's own pieces: DeepSpeed's
Ulysses registered and its groups checked (trainer/parallel/sequence_parallel.py), the project's ZeRO-2 JSON resolved
for
the size, the row cut into each rank's part, the loss through the trainer's loss head. The row's last `--targets`
tokens are the answer (the loss's targets), so the output layer over 151,936 words does not hide the model's own
cost. A sampler thread reads the rank's RssAnon (/proc/self/status) every 20 ms; the table gives the largest rank's
peak, its ratio to one rank's at the same length (the goal: at most 0.6 at size 2), the step's part of it (the peak
less what the rank held before its first step: the activations, which the size divides; the rest is the process, the
weights and the engine, which it does not) with its ratio, and tokens/s: the row's tokens
over the median optimizer step of `--repeats` (with the spread, min to max). Every case runs its ranks on all of this
machine's cores (OMP threads = cores / ranks, at least 1). A size that Ulysses cannot split the model's heads
by is a line saying so, not a run (the 0.5B shape's 14 heads and 4 ranks). Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GB = 2**30
QWEN_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14, "num_key_value_heads": 2}
QWEN_05B |= {
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 32768,
}
TOY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}
TOY |= {"vocab_size": 512, "tie_word_embeddings": True, "max_position_embeddings": 4096}


def build_model(directory: Path, shape: dict[str, Any], layers: int) -> str:
    """A Qwen2 model of `shape` with random float32 weights, saved as a publisher ships it."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(num_hidden_layers=layers, attn_implementation="sdpa", **shape)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return str(directory)


class PeakSampler(threading.Thread):
    """The process's largest RssAnon, read every 20 ms."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0

    def run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_anon())
            time.sleep(0.02)


def rss_anon() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


def worker(args: argparse.Namespace) -> None:
    """One rank: Ulysses for the size, LoRA under ZeRO-2, `repeats` optimizer steps on its part of one row."""
    sampler = PeakSampler()
    sampler.start()
    import deepspeed
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from config.deepspeed import ModelShape, read_deepspeed_json, resolve_from_runtime, resolve_from_train
    from config.sections.model_train import TrainConfig
    from storage.shards import IGNORE_INDEX, Row
    from trainer.data import collate
    from trainer.loss.chunked import LossHead
    from trainer.model.load import model_config
    from trainer.parallel import distributed, sequence_parallel

    size = int(os.environ["WORLD_SIZE"])
    dist = sequence_parallel.split_sequences(distributed.init(deepspeed_backend=True), size, args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    # The weights into the rank's own memory at every size: loaded from safetensors they are file pages until written,
    # outside RssAnon, and only a rank that receives DeepSpeed's broadcast of them (size > 1) writes them; without the
    # copy a rank of size 2 counted 0.55 GB of weights that one rank did not.
    for parameter in model.parameters():
        parameter.data = parameter.data.clone()
    sequence_parallel.check_attention(model, size)
    if args.tiled_mlp:
        from trainer.model.tiled_mlp import tile_mlps

        tile_mlps(model)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=targets))
    train = TrainConfig(micro_batch_size=1, gradient_accumulation_steps=1, sequence_parallel_size=size)
    ds = resolve_from_train(read_deepspeed_json(str(ROOT / "config/deepspeed/zero2.json")), train, size)
    ds = resolve_from_runtime(ds, bf16=False, shape=ModelShape.of(model_config(args.model)))
    params = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=params, config=ds, mpu=sequence_parallel.groups(dist)
    )
    head = LossHead.of(engine, args.loss_chunk)
    ids = torch.randint(
        0, int(model_config(args.model)["vocab_size"]), (args.length,), generator=torch.Generator().manual_seed(1)
    )
    labels = [IGNORE_INDEX] * (args.length - args.targets) + ids[-args.targets :].tolist()
    batch = sequence_parallel.shard(collate([Row(ids.tolist(), labels, [args.length])], 0), dist)
    # What the rank holds before its first step (the process, the weights, the engine, its part of the row): the
    # peak less this is what the step adds, the part that sequence parallelism divides.
    before = rss_anon()
    step_s = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        out = engine(**batch.model_inputs(dist.device), **head.forward_kwargs(dist.device))
        loss = head.summed(out, batch.labels)
        engine.backward(loss)
        engine.step()
        step_s.append(time.perf_counter() - started)
    (total,) = distributed.dist_sum([float(loss.detach())], dist)
    figures = distributed.gather_objects({"peak": sampler.peak, "before": before, "step_s": step_s}, dist)
    if dist.is_main:
        print("RESULT " + json.dumps({"ranks": size, "length": args.length, "loss": total, "per_rank": figures}))
    distributed.shutdown()


def run_case(model: str, length: int, ranks: int, args: argparse.Namespace) -> dict[str, Any]:
    """One torchrun launch; its figures."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // ranks)), "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}", f"--master-port={port}"]
    command += [__file__, "--worker", "--model", model, "--length", str(length), "--repeats", str(args.repeats)]
    command += ["--targets", str(args.targets), "--loss-chunk", str(args.loss_chunk)]
    command += ["--tiled-mlp"] if args.tiled_mlp else []
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{ranks} ranks at {length} tokens failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result = json.loads(lines[-1].removeprefix("RESULT "))
    steps = result["per_rank"][0]["step_s"]
    median = statistics.median(steps)
    return {
        "length": length,
        "ranks": ranks,
        "peak_gb": max(rank["peak"] for rank in result["per_rank"]) / GB,
        "step_gb": max(rank["peak"] - rank["before"] for rank in result["per_rank"]) / GB,
        "tokens_per_s": length / median,
        "step_s": median,
        "spread_s": [min(steps), max(steps)],
        "loss": result["loss"],
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Every (length, ranks) case; prints the table and returns its rows."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="8192,16384")
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--targets", type=int, default=512, help="the row's last tokens that are the loss's targets")
    parser.add_argument(
        "--loss-chunk", type=int, default=1024, help="train.loss_chunk_tokens: the tokens whose logits exist at once"
    )
    parser.add_argument("--tiled-mlp", action="store_true", help="train.tiled_mlp: each MLP a tile at a time")
    parser.add_argument("--toy", action="store_true", help="a tiny model at 256 tokens on 1 and 2 ranks, 1 repeat")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    from config.sequence_parallel import heads_problem

    if args.worker:
        worker(args)
        return []
    if args.toy:
        args.lengths, args.ranks, args.repeats, args.targets, args.layers = "256", "1,2", 1, 64, 1
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-sp-") as tmp:
        shape = TOY if args.toy else QWEN_05B
        model = build_model(Path(tmp) / "model", shape, args.layers)
        for length in (int(n) for n in args.lengths.split(",")):
            for ranks in (int(n) for n in args.ranks.split(",")):
                if problem := heads_problem(ranks, shape["num_attention_heads"], shape["num_key_value_heads"]):
                    print(f"{length:>6} tokens  {ranks} ranks  not run: {problem}", flush=True)
                    continue
                rows.append(run_case(model, length, ranks, args))
                alone = next(r for r in rows if r["length"] == length and r["ranks"] == 1)
                row = rows[-1] | {
                    "peak_ratio": rows[-1]["peak_gb"] / alone["peak_gb"],
                    "step_ratio": rows[-1]["step_gb"] / alone["step_gb"],
                }
                rows[-1] = row
                print(
                    f"{length:>6} tokens  {ranks} ranks  peak {row['peak_gb']:6.2f} GB a rank "
                    f"({row['peak_ratio']:.2f}x one rank's), of it the step's {row['step_gb']:5.2f} GB "
                    f"({row['step_ratio']:.2f}x)  {row['tokens_per_s']:8.1f} tokens/s  "
                    f"step {row['step_s']:.2f} s ({row['spread_s'][0]:.2f}-{row['spread_s'][1]:.2f})  "
                    f"loss {row['loss']:.4f}",
                    flush=True,
                )
    return rows


if __name__ == "__main__":
    main()
