"""staging/images.py: image records staged as users have them (LLaMA-Factory's mllm_demo layout, OpenAI image parts,
LLaVA's `image`), every image checked, stored once under its digest and listed in the manifest; and each bad input
refused in one line before anything is staged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from config.sections.run_data import DataConfig
from core.errors import UserError
from staging.formats import InvalidRecord
from staging.images import ImageReader, check_placeholders, lift_image_parts, with_images
from staging.stage import stage_dataset
from storage.digest import digest_bytes
from storage.location import Location
from storage.shards import IGNORE_INDEX

DEMO = Path(__file__).resolve().parents[3] / "data" / "mllm_demo"


def stage(source: str | Path, storage: Path, model: str, **settings) -> object:
    data = DataConfig(**{"source": str(source), "max_length": 256, "eval_ratio": 0.2, "num_proc": 1, **settings})
    return stage_dataset(data, Location(str(storage)), model, progress=lambda _: None, bars=False)


def rows(ref: object) -> list[dict]:
    out = []
    for shard in sorted(Path(ref.url).glob("*/shard-*.arrow")):  # type: ignore[attr-defined]
        out += pa.ipc.open_file(shard).read_all().to_pylist()
    return out


@pytest.fixture(scope="module")
def demo(qwen25_vl: str, tmp_path_factory: pytest.TempPathFactory) -> object:
    """The demo set staged for the scaled Qwen2.5-VL."""
    return stage(DEMO / "dataset_info.json#mllm_demo", tmp_path_factory.mktemp("vl-storage"), qwen25_vl)


def test_the_demo_stages_24_records_and_6_images_once_each_with_their_digests(demo, qwen25_vl: str) -> None:
    manifest = json.loads((Path(demo.url) / "manifest.json").read_text())
    assert manifest["schema"] == "tandem.dataset/2"
    assert manifest["records"] == {"read": 24, "staged": 24, "rejected": 0, "dropped": 0, "undesirable": 0}
    images = [f for f in manifest["files"] if f["path"].startswith("images/")]
    assert len(images) == 6 and manifest["images"]["count"] == 6
    for entry in images:
        data = (Path(demo.url) / entry["path"]).read_bytes()
        assert entry["digest"] == digest_bytes(data, "blake3") and entry["size"] == len(data)
        assert entry["path"] == f"images/{entry['digest']}.{'jpg' if entry['source'].endswith('.jpg') else 'png'}"
        assert (DEMO / "mllm_demo_data" / Path(entry["source"]).name).read_bytes() == data  # the user's bytes
    staged = rows(demo)
    assert sum(len(r["images"]) for r in staged) == sum(c["images"] for c in manifest["splits"].values()) == 30


def test_each_image_is_its_grids_tokens_never_a_target(demo, qwen25_vl: str) -> None:
    from PIL import Image
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(qwen25_vl, backend="pil")
    config = json.loads((Path(qwen25_vl) / "config.json").read_text())
    size = {"shortest_edge": 1024, "longest_edge": 589824}  # data.image_min_pixels, data.image_max_pixels
    for row in rows(demo):
        ids, labels = row["input_ids"], row["labels"]
        pads = [i for i, token in enumerate(ids) if token == config["image_token_id"]]
        assert len(pads) == sum(row["image_tokens"]) and all(labels[i] == IGNORE_INDEX for i in pads)
        for name, tokens in zip(row["images"], row["image_tokens"], strict=True):
            with Image.open(Path(demo.url) / "images" / name) as image:
                grid = processor(images=[image.convert("RGB")], size=size, return_tensors="pt")["image_grid_thw"]
            assert int(grid.prod()) // 4 == tokens
        starts = [i for i, token in enumerate(ids) if token == config["vision_start_token_id"]]
        assert len(starts) == len(row["images"])


def test_openai_parts_and_llava_records_stage_as_the_demos_rows(tmp_path: Path, demo, qwen25_vl: str) -> None:
    shutil.copytree(DEMO / "mllm_demo_data", tmp_path / "pictures")
    question = "<image>What shape is in the picture?"
    openai = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image", "image": "pictures/1.png"}, {"type": "text", "text": question[7:]}],
            },
            {"role": "assistant", "content": "A circle."},
        ]
    }
    llava = {
        "image": "pictures/1.png",
        "conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": "A circle."}],
    }
    shapes = [r for r in rows(demo) if r["images"] and r["labels"].count(IGNORE_INDEX) and len(r["images"]) == 1]
    for record in (openai, llava):
        (tmp_path / "d.jsonl").write_text(json.dumps(record) + "\n" + json.dumps(record) + "\n")
        ref = stage(tmp_path / "d.jsonl", tmp_path / "store", qwen25_vl, eval_ratio=0.0)
        (row,) = {json.dumps(r) for r in rows(ref)}  # the same record twice: one row's content
        assert json.loads(row)["input_ids"] in [r["input_ids"] for r in shapes]


def test_where_the_images_are_kept_never_names_the_dataset_but_their_bytes_do(tmp_path: Path, demo, qwen25_vl) -> None:
    moved = tmp_path / "moved"
    shutil.copytree(DEMO, moved)
    again = stage(moved / "dataset_info.json#mllm_demo", tmp_path / "store", qwen25_vl)
    assert again.dataset_id == demo.dataset_id
    from PIL import Image

    Image.new("RGB", (112, 112), (0, 0, 0)).save(moved / "mllm_demo_data" / "1.png")
    changed = stage(moved / "dataset_info.json#mllm_demo", tmp_path / "store", qwen25_vl)
    assert changed.dataset_id != demo.dataset_id


def demo_copy(tmp_path: Path, change) -> Path:
    """The demo's data file beside its pictures, its records changed by `change`; returns the data file."""
    shutil.copytree(DEMO / "mllm_demo_data", tmp_path / "mllm_demo_data", dirs_exist_ok=True)
    records = json.loads((DEMO / "mllm_demo.json").read_text())
    change(records)
    path = tmp_path / "mllm_demo.json"
    path.write_text(json.dumps(records))
    return path


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            lambda r: r[3].update(images=["mllm_demo_data/9.png", r[3]["images"][1]]),
            "mllm_demo.json[3]: images[0]: {folder}/mllm_demo_data/9.png does not exist (paths are relative to the "
            "data file)",
        ),
        (lambda r: r[1].update(images=["mllm_demo.json"]), "mllm_demo.json[1]: images[0]: {folder}/mllm_demo.json is "),
        (
            lambda r: r[0].update(images=r[3]["images"]),
            "mllm_demo.json[0]: the turns hold 1 <image> placeholder but the record has 2 images; put one <image>",
        ),
        (
            lambda r: r[3].update(images=r[3]["images"][:1]),
            "mllm_demo.json[3]: the turns hold 2 <image> placeholders but the record has 1 image; put one <image>",
        ),
        (
            lambda r: r[5].pop("images"),
            "mllm_demo.json[5]: the turns hold 1 <image> placeholder but the record has no images (column images)",
        ),
    ],
    ids=["missing", "undecodable", "fewer-placeholders", "more-placeholders", "no-images-column"],
)
def test_bad_image_records_stop_staging_in_one_line_with_nothing_staged(tmp_path: Path, change, reason, qwen25_vl):
    path = demo_copy(tmp_path, change)
    with pytest.raises(UserError) as info:
        stage(path, tmp_path / "store", qwen25_vl)
    message = str(info.value)
    assert message.startswith(f"{tmp_path}/" + reason.format(folder=tmp_path)) and "\n" not in message
    assert info.value.exit_code == 2
    assert not any((tmp_path / "store" / "datasets").glob("ds-*"))  # nothing staged


def test_an_image_set_for_a_text_only_model_is_refused_naming_the_record(tmp_path: Path, tiny_model: str) -> None:
    with pytest.raises(UserError, match=r"mllm_demo\.json\[0\]: a record with images, but .* is a text-only model"):
        stage(DEMO / "dataset_info.json#mllm_demo", tmp_path / "store", tiny_model)


def test_image_parts_become_placeholders_joined_to_their_text() -> None:
    record = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Compare"},
                    {"type": "image_url", "image_url": {"url": "a.png"}},
                    {"type": "image", "value": "b.png"},
                ],
            },
            {"role": "user", "content": [{"type": "image", "image": "c.png"}, {"type": "text", "text": "and this?"}]},
            {"role": "assistant", "content": "ok"},
        ]
    }
    lifted = lift_image_parts(record)
    assert lifted["images"] == ["a.png", "b.png", "c.png"]  # type: ignore[index]
    assert lifted["messages"][0]["content"] == [{"type": "text", "text": "Compare<image><image>"}]  # type: ignore[index]
    assert lifted["messages"][1]["content"] == [{"type": "text", "text": "<image>and this?"}]  # type: ignore[index]
    assert lift_image_parts({"messages": [{"role": "user", "content": "hi"}]}) == {
        "messages": [{"role": "user", "content": "hi"}]
    }
    with pytest.raises(InvalidRecord, match="images given both as content parts and as an images list"):
        lift_image_parts({**record, "images": ["x.png"]})


def test_an_image_in_an_answer_or_a_plain_text_record_is_refused() -> None:
    answer = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<image>"}]}
    with pytest.raises(InvalidRecord, match=r"turn 1 \(assistant\) holds an <image> placeholder"):
        check_placeholders(answer, 1)
    with pytest.raises(InvalidRecord, match="a plain-text record"):
        with_images({"text": "x"}, {"text": "x", "images": ["a.png"]})


def test_a_local_image_is_read_once_per_version(tmp_path: Path, monkeypatch) -> None:
    from PIL import Image

    Image.new("RGB", (60, 40), (1, 2, 3)).save(tmp_path / "a.png")
    reader, calls = ImageReader("sha256"), []
    original = reader.decode
    monkeypatch.setattr(reader, "decode", lambda *a: calls.append(a) or original(*a))
    folder = Location(str(tmp_path))
    first = reader.read("a.png", folder, 0)
    assert reader.read("a.png", folder, 0) == first and len(calls) == 1
    assert (first.width, first.height) == (60, 40) and first.name.endswith(".png")
    Image.new("RGB", (30, 10), (1, 2, 3)).save(tmp_path / "a.png")  # a new version: read again
    assert reader.read("a.png", folder, 0).width == 30 and len(calls) == 2
    Image.new("RGB", (1, 300), (1, 2, 3)).save(tmp_path / "thin.png")
    with pytest.raises(InvalidRecord, match="1x300 pixels, an aspect ratio over 200"):
        reader.read("thin.png", folder, 0)
