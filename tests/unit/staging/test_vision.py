"""staging/vision.py: each `<image>` expanded into its grid's tokens as Qwen's processor does, held to what the
tokenizer encoded, and a window of data.max_length that would cut an image refused (the record dropped and counted)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from config.sections.run_data import DataConfig
from config.vision import Patches
from core.errors import UserError
from staging.formats import InvalidRecord
from staging.stage import stage_dataset
from staging.vision import Vision, cut_reason, expand, image_runs, keeps_images, vision_of
from storage.location import Location

VISION = Vision(Patches(14, 2, 2), 1024, 589824, start_id=1, pad_id=2, end_id=3)
TEXTS = ("<s>", "<p>", "</s>")
DEMO = Path(__file__).resolve().parents[3] / "data" / "mllm_demo"


def test_each_placeholder_becomes_its_images_tokens_in_order() -> None:
    conversation = {
        "messages": [
            {"role": "user", "content": "<image>A<image>"},
            {"role": "assistant", "content": "B"},
        ],
        "images": [{"name": "a.png", "width": 320, "height": 240}, {"name": "b.png", "width": 56, "height": 56}],
    }
    expanded, (names, tokens) = expand(conversation, VISION, TEXTS)
    assert (names, tokens) == (("a.png", "b.png"), (99, 4))  # (18 x 22) / 4 and (4 x 4) / 4
    assert expanded["messages"][0]["content"] == f"<s>{'<p>' * 99}</s>A<s>{'<p>' * 4}</s>"
    assert expanded["messages"][1] == conversation["messages"][1]
    with pytest.raises(InvalidRecord, match="text-only model"):
        expand(conversation, None, TEXTS)


def test_the_encoded_runs_are_held_to_the_images_and_to_the_window() -> None:
    ids = np.array([9, 1, 2, 2, 2, 3, 9, 1, 2, 3, 9])
    runs = image_runs(ids, VISION, (("a", "b"), (3, 1)))
    assert runs == [(2, 5), (8, 9)]
    with pytest.raises(UserError, match=r"encoded the images' tokens as runs of \[3, 1\], not \[4, 1\]"):
        image_runs(ids, VISION, (("a", "b"), (4, 1)))
    assert image_runs(ids, None, (("a",), (3,))) == [] and image_runs(ids, VISION, ((), ())) == []
    assert keeps_images(runs, 0, 11) and keeps_images(runs, 2, 9) and not keeps_images(runs, 3, 11)
    assert not keeps_images(runs, 0, 8)  # the second image left out: its tokens and image no longer match
    assert cut_reason(300, runs, 256).startswith(
        "300 tokens (4 of them its 2 images'), longer than data.max_length=256"
    )


def test_a_record_whose_window_would_cut_an_image_is_dropped_and_counted(tmp_path: Path, qwen25_vl: str) -> None:
    shutil.copytree(DEMO / "mllm_demo_data", tmp_path / "mllm_demo_data")
    long_prompt = "<image>" + " ".join(["shape"] * 60) + "?"
    records = json.loads((DEMO / "mllm_demo.json").read_text())[:8]
    records[0]["messages"][0]["content"] = long_prompt
    (tmp_path / "d.json").write_text(json.dumps(records))
    data = DataConfig(source=str(tmp_path / "d.json"), max_length=64, eval_ratio=0.0, num_proc=1)
    ref = stage_dataset(data, Location(str(tmp_path / "store")), qwen25_vl, progress=lambda _: None, bars=False)
    manifest = json.loads((Path(ref.url) / "manifest.json").read_text())
    assert manifest["records"]["dropped"] >= 1 and manifest["splits"]["train"]["dropped"] >= 1
    rejects = (Path(ref.url) / "rejects.jsonl").read_text()
    assert "and a shorter window would cut an image; raise data.max_length or lower data.image_max_pixels" in rejects
    assert "(data.excess_length=drop)" not in rejects  # truncate was asked: the image is why it was dropped


def test_a_vision_directory_without_its_processor_or_of_another_family_is_refused(tmp_path: Path, qwen25_vl) -> None:
    config = json.loads((Path(qwen25_vl) / "config.json").read_text())
    data = DataConfig()
    vision = vision_of(qwen25_vl, config, data)
    assert vision is not None and vision.describe() == {
        "patch_size": 14,
        "merge_size": 2,
        "min_pixels": 1024,
        "max_pixels": 589824,
    }
    assert vision_of(qwen25_vl, {"hidden_size": 8}, data) is None
    with pytest.raises(UserError, match=r"a vision-language model .* without a readable preprocessor_config\.json"):
        vision_of(str(tmp_path), config, data)
    with pytest.raises(UserError, match="model type 'llava' is a vision-language model Tandem does not train"):
        vision_of(qwen25_vl, {**config, "model_type": "llava"}, data)
