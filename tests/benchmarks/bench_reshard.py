"""Converting a checkpoint to DeepSpeed's universal form (resume on another world size), per GB, measured in one
session on this machine.

    .venv/bin/python -m pytest tests/benchmarks/bench_reshard.py -s        (or: make bench)
    .venv/bin/python tests/benchmarks/bench_reshard.py --repeats 3 --hidden 1024 --layers 8

A Qwen2-shaped model with the tiny tokenizer's vocabulary, widened to `--hidden` x `--layers` (random weights, about
100 M parameters at the defaults), is fully fine-tuned for one step on 2 ranks with ZeRO-2, which writes a checkpoint
of about 1.4 GB (fp32 weights, fp32 master copy, Adam's two moments). Then, `--repeats` times: the baseline, reading
every byte of the checkpoint once (the least any conversion must do), and the conversion as a resume runs it
(`trainer.checkpointing.reshard.convert`: DeepSpeed's ds_to_universal, then the published manifest and COMPLETE).
Prints the medians, seconds per GB of checkpoint, and the ratio to the baseline; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from storage import layout
from storage.checkpoints import read_complete
from storage.location import Location
from tests.distributed.harness import stage, train
from trainer.checkpointing.reshard import convert


def wide_model(tiny: str, out: Path, hidden: int, layers: int) -> str:
    """The tiny model's tokenizer and vocabulary with a wider, deeper Qwen2 (random weights), saved to `out`."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny)
    config.update(
        {
            "hidden_size": hidden,
            "intermediate_size": hidden * 11 // 4,
            "num_hidden_layers": layers,
            "num_attention_heads": hidden // 64,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "layer_types": ["full_attention"] * layers,
            "max_window_layers": layers,
        }
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(out)
    return str(out)


def read_all(directory: Path) -> int:
    """Read every byte under `directory` once (the baseline); returns the bytes read."""
    total = 0
    for path in directory.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                while chunk := handle.read(1 << 24):
                    total += len(chunk)
    return total


def run(repeats: int, hidden: int, layers: int) -> dict[str, float]:
    """Train the wide model one step, then time reading its checkpoint and converting it; print and return the
    medians."""
    work = Path(tempfile.mkdtemp(prefix="tandem-bench-reshard-"))
    try:
        staged = stage(work / "storage")
        model = wide_model(staged.model_path, work / "wide", hidden, layers)
        staged = type(staged)(staged.storage, model, staged.dataset)
        done = train(
            staged,
            "wide",
            [
                "launch.nnodes=2",
                "train.method=full",
                "train.max_steps=1",
                "train.save_steps=1",
                "train.micro_batch_size=1",
                "train.gradient_accumulation_steps=1",
                "data.max_length=64",
            ],
        )
        ckpt = read_complete(Location(str(done.checkpoint(1))))
        size = sum(entry["size"] for entry in ckpt.manifest["files"])
        baseline, converted = [], []
        for _ in range(repeats):
            started = time.perf_counter()
            read_all(done.checkpoint(1))
            baseline.append(time.perf_counter() - started)
            shutil.rmtree(str(layout.universal_dir(ckpt.url)), ignore_errors=True)
            written, seconds = convert(ckpt, "blake3")
            converted.append(seconds)
        b, c = statistics.median(baseline), statistics.median(converted)
        gb = size / 1e9
        print(
            f"\ncheckpoint {gb:.2f} GB (ZeRO-2, full fine-tuning, 2 ranks), universal form {written / 1e9:.2f} GB; "
            f"median of {repeats}: read once {b:.1f} s ({b / gb:.1f} s/GB), convert {c:.1f} s ({c / gb:.1f} s/GB): "
            f"{c / b:.1f}x the read"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"checkpoint_gb": gb, "universal_gb": written / 1e9, "read_s": b, "convert_s": c, "convert_s_per_gb": c / gb}


def test_conversion_per_gb() -> None:
    """On demand (not in the default run): prints the figures."""
    run(repeats=3, hidden=1024, layers=8)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """The script's entry point; returns the printed figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args(argv)
    return run(args.repeats, args.hidden, args.layers)


if __name__ == "__main__":
    main()
