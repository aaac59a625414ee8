"""Images per second through a vision-language model's data loader against what its training step consumes, at 1 and
2 ranks: the loader (trainer/images.py in the step prefetch's worker: each micro-batch's staged images read, decoded
and cut into patches by the model's own image processor, the rows' 3-D positions) must outrun the step, so that a
step never waits for its images (data_time_s in metrics.jsonl near 0).

    python tests/benchmarks/bench_vision.py                                  # 96 records, 448 x 448 pictures
    python tests/benchmarks/bench_vision.py --records 48 --image-size 672 --steps 8 --repeats 3

Random weights: a directory laid out as Qwen2.5-VL-3B-Instruct is published (tests/published_vision.py), scaled down,
its vision tower --vision-depth blocks of --vision-hidden; generated pictures (seeded noise, JPEG and PNG), one or two a
record, staged as LLaMA-Factory's mllm_demo layout is. For each world size:

- the loader: every rank's deal of each step (its micro-batches, with their images), each rank's in a thread of its
  own as each rank's prefetch worker runs it, over --steps steps; images dealt per second, all ranks together;
- the step: the real trainer (LoRA, ZeRO-2) on 1 or 2 local torchrun nodes of one rank, its step_time_s and
  data_time_s from metrics.jsonl after the first (warm-up) step, and the images each step trains on; images consumed
  per second.

Medians of --repeats with their spread (max - min), and the ratio loader / step. On one machine the loader's threads
and the ranks share its cores, as they do on a real node. Nothing here asserts a time: it prints.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MICRO, ACCUM = 2, 2  # rows per micro-batch, micro-batches per rank and step


def make_pictures(folder: Path, count: int, size: int) -> list[str]:
    """`count` pictures of seeded noise, size x size (x 3/4 high for every other one), JPEG and PNG in turn."""
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng, names = np.random.default_rng(0), []
    for index in range(count):
        height = size if index % 2 else size * 3 // 4
        pixels = rng.integers(0, 256, (height, size, 3), dtype=np.uint8)
        name = f"{index}.{'jpg' if index % 2 else 'png'}"
        Image.fromarray(pixels).save(folder / name)
        names.append(name)
    return names


def make_dataset(work: Path, records: int, size: int) -> str:
    """The records and dataset_info.json (LLaMA-Factory's layout); returns the data.source reference."""
    names = make_pictures(work / "pictures", max(records // 2, 2), size)
    rows = []
    for index in range(records):
        first, second = names[index % len(names)], names[(index + 1) % len(names)]
        two = index % 3 == 0
        question = "<image><image>Are these the same?" if two else "<image>Describe the picture."
        images = [f"pictures/{first}", f"pictures/{second}"] if two else [f"pictures/{first}"]
        answer = f"Picture {first} is noise number {index}."
        turns = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        rows.append({"messages": turns, "images": images})
    (work / "records.json").write_text(json.dumps(rows))
    columns = {"messages": "messages", "images": "images"}
    info = {"bench": {"file_name": "records.json", "formatting": "sharegpt", "columns": columns}}
    info["bench"]["tags"] = {
        "role_tag": "role",
        "content_tag": "content",
        "user_tag": "user",
        "assistant_tag": "assistant",
    }
    (work / "dataset_info.json").write_text(json.dumps(info))
    return f"{work / 'dataset_info.json'}#bench"


def setup(work: Path, options: argparse.Namespace) -> tuple[Any, list[str]]:
    """(the staged dataset as the trainer's harness takes it, the runs' overrides)."""
    from config.loader import load_config
    from pipeline.models import resolve_model
    from tests.distributed.harness import stage
    from tests.published_vision import QWEN25_VL_3B_INSTRUCT, write_vision_published

    tiny = resolve_model(load_config(None, [f"run.storage={work / 'storage'}"]))
    scale = {
        "depth": options.vision_depth,
        "hidden_size": options.vision_hidden,
        "num_heads": options.vision_hidden // 64,
    }
    scale["intermediate_size"] = 2 * options.vision_hidden
    scale["fullatt_block_indexes"] = [options.vision_depth - 1]
    model = write_vision_published(work / "model", Path(tiny), QWEN25_VL_3B_INSTRUCT, vision_scale=scale)
    source = make_dataset(work / "data", options.records, options.image_size)
    data = [f"data.source={source}", f"data.max_length={options.max_length}", "data.eval_ratio=0.05"]
    return stage(work / "storage", str(model), data), data


def loader_images_per_s(staged: Any, world: int, steps: int) -> tuple[float, int]:
    """(images per second dealt by `world` ranks' threads over `steps` steps, the images dealt)."""
    from config.sections.launch import LaunchConfig
    from storage.local_dataset import open_split
    from storage.location import Location
    from storage.node_cache import node_cache
    from trainer.data import Dealing, GlobalOrder, rank_micro_batches
    from trainer.images import ImageInputs

    config = json.loads((Path(staged.model_path) / "config.json").read_text())
    inputs = ImageInputs.of(staged.model_path, config)
    split = open_split(Location(staged.dataset.url), "train", node_cache(LaunchConfig()))
    order, counts = GlobalOrder(len(split), 0), [0] * world

    def rank(r: int) -> None:
        for step in range(steps):
            dealing = Dealing(step, MICRO, ACCUM, r, world, 0, images=inputs)
            for batch in rank_micro_batches(split, order, dealing):
                counts[r] += 0 if batch.image_grid_thw is None else len(batch.image_grid_thw)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    split.close()
    return sum(counts) / seconds, sum(counts)


def step_images_per_s(staged: Any, world: int, steps: int, name: str) -> tuple[float, float]:
    """(images the real trainer's steps consume per second on `world` ranks, the median data_time_s), after the first
    step: each step's images from its rows, over its step_time_s."""
    from config.sections.launch import LaunchConfig
    from storage.local_dataset import open_split
    from storage.location import Location
    from storage.node_cache import node_cache
    from tests.distributed.harness import train
    from trainer.data import GlobalOrder

    overrides = [
        f"launch.nnodes={world}",
        f"train.max_steps={steps}",
        f"train.save_steps={steps}",
        "train.lora.dropout=0",
    ]
    overrides += [f"train.micro_batch_size={MICRO}", f"train.gradient_accumulation_steps={ACCUM}"]
    run = train(staged, name, overrides)
    rows = [r for r in run.metrics() if "event" not in r and r["step"] > 1]
    split = open_split(Location(staged.dataset.url), "train", node_cache(LaunchConfig()))
    order, per_step = GlobalOrder(len(split), run.spec.config.train.seed), MICRO * ACCUM * world
    images = [sum(len(split[i].images) for i in order.step_indices(r["step"] - 1, per_step)) for r in rows]
    split.close()
    return sum(images) / sum(r["step_time_s"] for r in rows), statistics.median(r["data_time_s"] for r in rows)


def median_spread(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), max(values) - min(values)


def measure(staged: Any, options: argparse.Namespace) -> dict[str, float]:
    """Every figure, for 1 and 2 ranks (module docstring), printed as it is measured."""
    result: dict[str, float] = {}
    for world in (1, 2):
        loader = [loader_images_per_s(staged, world, options.steps)[0] for _ in range(options.repeats)]
        steps = [step_images_per_s(staged, world, options.steps, f"vision-{world}-{i}") for i in range(options.repeats)]
        (dealt, dealt_spread), (consumed, consumed_spread) = median_spread(loader), median_spread([s[0] for s in steps])
        waited = statistics.median(s[1] for s in steps)
        result |= {
            f"loader_images_per_s_{world}": dealt,
            f"step_images_per_s_{world}": consumed,
            f"ratio_{world}": dealt / consumed,
            f"data_time_s_{world}": waited,
        }
        print(
            f"{world} rank{'s' if world > 1 else ''}: the loader deals {dealt:.1f} images/s (spread "
            f"{dealt_spread:.1f}), the step consumes {consumed:.1f} images/s (spread {consumed_spread:.1f}): loader "
            f"x{dealt / consumed:.1f} "
            f"of the step; rank 0 waited {waited:.4f} s a step for its rows (data_time_s, median)",
            flush=True,
        )
    return result


def main(argv: list[str] | None = None) -> dict[str, float]:
    """The script's entry point; returns the printed figures (tests/benchmarks/test_toy_runs.py runs it small)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=96)
    parser.add_argument("--image-size", type=int, default=448, help="the pictures' width in pixels")
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--vision-depth", type=int, default=4)
    parser.add_argument("--vision-hidden", type=int, default=128)
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per run (the first is warm-up)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--work", type=Path, default=None, help="where the model, data and runs go (default: a temp dir)"
    )
    options = parser.parse_args(argv)
    if options.steps < 2:
        parser.error(f"--steps must be at least 2 (the first is warm-up, not measured), got {options.steps}")
    work = options.work or Path(tempfile.mkdtemp(prefix="bench-vision-"))
    try:
        staged, _ = setup(work, options)
        return measure(staged, options)
    finally:
        if options.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
