"""trainer/images.py: a vision-language model's micro-batches carry their staged images as the model's own processor
cuts them, held to the tokens staging counted, with 3-D positions in every layout; and the images are read and cut in
the step prefetch's worker thread, off the step's critical path."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import pytest
import torch

from config.sections.launch import LaunchConfig
from config.sections.run_data import DataConfig
from core.errors import UserError
from staging.stage import stage_dataset
from storage.local_dataset import open_split
from storage.location import Location
from storage.node_cache import node_cache
from trainer.data import Dealing, GlobalOrder, batch_of, collate, collate_flat, rank_micro_batches
from trainer.images import ImageInputs
from trainer.prefetch import StepPrefetcher

DEMO = Path(__file__).resolve().parents[3] / "data" / "mllm_demo"


@pytest.fixture(scope="module")
def split(qwen25_vl: str, tmp_path_factory: pytest.TempPathFactory):
    data = DataConfig(source=f"{DEMO}/dataset_info.json#mllm_demo", max_length=256, eval_ratio=0.2, num_proc=1)
    storage = Location(str(tmp_path_factory.mktemp("vl-data")))
    ref = stage_dataset(data, storage, qwen25_vl, progress=lambda _: None, bars=False)
    with open_split(Location(ref.url), "train", node_cache(LaunchConfig())) as train:
        yield train


@pytest.fixture(scope="module")
def inputs(qwen25_vl: str) -> ImageInputs:
    config = json.loads((Path(qwen25_vl) / "config.json").read_text())
    found = ImageInputs.of(qwen25_vl, config)
    assert found is not None and ImageInputs.of(qwen25_vl, {"hidden_size": 8}) is None
    return found


def test_a_micro_batch_carries_its_rows_images_and_3d_positions(split, inputs: ImageInputs) -> None:
    rows = [split[i] for i in range(4)]
    batch = batch_of(rows, 0, collate, inputs, split.images)
    names = [n for row in rows for n in row.images]
    tokens = sum(t for row in rows for t in row.image_tokens)
    assert batch.image_grid_thw is not None and batch.pixel_values is not None
    assert len(batch.image_grid_thw) == len(names) and int(batch.image_grid_thw.prod(-1).sum()) == 4 * tokens
    assert batch.pixel_values.shape == (int(batch.image_grid_thw.prod(-1).sum()), 3 * 2 * 14 * 14)
    assert batch.position_ids is not None and batch.position_ids.shape == (3, *batch.input_ids.shape)
    inputs_for_model = batch.model_inputs(torch.device("cpu"))
    assert {"attention_mask", "position_ids", "pixel_values", "image_grid_thw"} <= set(inputs_for_model)
    flat = batch_of(rows, 0, collate_flat, inputs, split.images)
    assert flat.position_ids is not None and flat.position_ids.shape == (4, 1, sum(len(r.input_ids) for r in rows))
    assert "attention_mask" not in flat.model_inputs(torch.device("cpu"))  # its examples apart by their positions
    assert batch_of(rows, 0, collate, None).pixel_values is None  # a causal LM's batch, as before


def test_grids_that_disagree_with_the_staged_tokens_stop_in_one_line(split, inputs: ImageInputs) -> None:
    assert split.images is not None
    larger = dataclasses.replace(split.images, min_pixels=200_000)
    with pytest.raises(UserError, match=r"image .*: the image processor gives \d+ tokens, staged with \d+"):
        batch_of([split[0]], 0, collate, inputs, larger)
    assert split.images.label(next(iter(split.images.sources))) in {f"{i}.png" for i in (1, 2, 3, 5, 6)} | {"4.jpg"}


def test_the_images_are_read_and_cut_in_the_prefetchs_worker(split, inputs: ImageInputs, monkeypatch) -> None:
    threads: list[str] = []
    original = ImageInputs.pixels
    monkeypatch.setattr(
        ImageInputs, "pixels", lambda self, *a: threads.append(threading.current_thread().name) or original(self, *a)
    )
    order = GlobalOrder(len(split), seed=0)

    def deal(step: int) -> list:
        dealing = Dealing(step, 2, 2, 0, 1, 0, images=inputs)
        return list(rank_micro_batches(split, order, dealing))

    prefetch = StepPrefetcher(deal, 3, pin=False)
    try:
        prefetch.batches(0)  # the first step is dealt where it is asked for
        threads.clear()
        for step in (1, 2):
            batches = prefetch.batches(step)
            assert all(b.pixel_values is not None for b in batches)
    finally:
        prefetch.close()
    assert threads and all(name.startswith("prefetch") for name in threads)
