"""Vision-language models under real torchrun agents (marker `multirun`: several training runs each), on a directory
laid out as Qwen2.5-VL-3B-Instruct is published (scaled down: tests/published_vision.py) and the demo image set in
LLaMA-Factory's mllm_demo layout: 2 ranks equal 1 rank, ZeRO-3 equals ZeRO-2 with the vision tower training and
micro-batches without an image, Q-LoRA with the vision side whole, Qwen3-VL, the merged export loaded with
AutoModelForImageTextToText and its image processor and answering from an image, the evaluation's image answers, and
the whole pipeline's model card and lineage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from storage import layout
from tests.distributed.harness import Run, Staged, evaluate, stage, train

pytestmark = pytest.mark.multirun
DEMO = Path(__file__).resolve().parents[2] / "data" / "mllm_demo"
DEMO_SOURCE = f"data.source={DEMO}/dataset_info.json#mllm_demo"
# 3 steps of a global batch of 8 rows (micro-batches of 2), no dropout: the trajectory is the seed's and the step's.
STEPS = ["train.max_steps=3", "train.save_steps=3", "train.global_batch_size=8", "train.lora.dropout=0"]


def relative(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def vl_demo(qwen25_vl: str, tmp_path_factory: pytest.TempPathFactory) -> Staged:
    """The demo set staged for the scaled Qwen2.5-VL."""
    return stage(tmp_path_factory.mktemp("vl-storage"), qwen25_vl, [DEMO_SOURCE, "data.eval_ratio=0.2"])


@pytest.fixture(scope="module")
def two_ranks(vl_demo: Staged) -> Run:
    """LoRA, ZeRO-2, 2 nodes x 1 rank, the merged export written too."""
    return train(vl_demo, "vl-2", [*STEPS, "launch.nnodes=2", "train.export_merged=true"])


def test_two_ranks_train_as_one_within_1e_5(vl_demo: Staged, two_ranks: Run) -> None:
    one = train(vl_demo, "vl-1", [*STEPS, "launch.nnodes=1"])
    assert len(two_ranks.losses()) == 3 and relative(two_ranks.losses(), one.losses()) < 1e-5
    log = (two_ranks.run_dir / "nodes" / "0" / "log.txt").read_text()
    assert "model\\.language_model" in log and "model\\.visual" not in log  # the adapters' targets, logged
    assert all(r["data_time_s"] < 5 for r in two_ranks.metrics()[1:] if "event" not in r)


def test_zero3_equals_zero2_with_the_vision_tower_training_and_batches_without_images(
    tiny_model: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Full fine-tuning of Qwen2.5-VL-7B's layout (untied embeddings: with tied ones ZeRO-3's gradient norm differs
    from ZeRO-2's for a text model too), its vision tower training, on image records mixed with text-only ones, so
    that micro-batches without an image meet ones with images on the other rank."""
    from tests.published_vision import QWEN25_VL_7B_INSTRUCT, write_vision_published

    folder = tmp_path_factory.mktemp("vl7") / "Qwen2.5-VL-7B-scaled"
    model = str(write_vision_published(folder, Path(tiny_model), QWEN25_VL_7B_INSTRUCT))
    sample = Path(__file__).resolve().parents[2] / "data" / "sample" / "conversations.json"
    sources = (
        f"data.sources=[{{source: '{DEMO}/dataset_info.json#mllm_demo'}}, {{source: '{sample}', max_records: 24}}]"
    )
    mixed = stage(tmp_path_factory.mktemp("vl-mixed"), model, [sources, "data.eval_ratio=0.1"])
    full = [
        *STEPS,
        "launch.nnodes=2",
        "train.method=full",
        "train.learning_rate=1e-4",
        "model.freeze_vision_tower=false",
    ]
    zero2 = train(mixed, "vl-z2", full)
    zero3 = train(mixed, "vl-z3", [*full, "deepspeed.config=config/deepspeed/zero3.json"])
    assert relative(zero3.losses(), zero2.losses()) < 1e-5
    log = (zero3.run_dir / "nodes" / "0" / "log.txt").read_text()
    assert "the vision tower runs in every pass" in log and "vision_tower 1" in log


def test_qlora_keeps_the_vision_side_whole_and_qwen3_vl_trains(
    vl_demo: Staged, qwen3_vl: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    pytest.importorskip("bitsandbytes")
    qlora = train(vl_demo, "vl-qlora", [*STEPS, "launch.nnodes=1", "train.method=qlora"])
    assert len(qlora.losses()) == 3 and all(loss == loss for loss in qlora.losses())
    qwen3 = stage(tmp_path_factory.mktemp("vl3-storage"), qwen3_vl, [DEMO_SOURCE, "data.eval_ratio=0.2"])
    run = train(qwen3, "vl3", [*STEPS, "launch.nnodes=2"])
    assert len(run.losses()) == 3 and run.losses()[-1] < run.losses()[0] + 1.0


def test_the_merged_export_loads_as_published_and_answers_from_an_image(two_ranks: Run, qwen25_vl: str) -> None:
    from peft import PeftModel
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    final = Path(str(layout.final_dir(two_ranks.spec.run)))
    for folder in (final, final / "merged"):
        assert (folder / "preprocessor_config.json").is_file() and (folder / "chat_template.json").is_file()
    merged = AutoModelForImageTextToText.from_pretrained(final / "merged", dtype=torch.float32).eval()
    processor = AutoImageProcessor.from_pretrained(final / "merged", backend="pil")
    tokenizer = AutoTokenizer.from_pretrained(final / "merged")
    with Image.open(DEMO / "mllm_demo_data" / "1.png") as image:
        pixels = processor(
            images=[image.convert("RGB")], size={"shortest_edge": 1024, "longest_edge": 589824}, return_tensors="pt"
        )
    tokens = int(pixels["image_grid_thw"].prod()) // 4
    content = f"<|vision_start|>{'<|image_pad|>' * tokens}<|vision_end|>What shape is in the picture?"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(text, return_tensors="pt").input_ids
    inputs = {"pixel_values": pixels["pixel_values"], "image_grid_thw": pixels["image_grid_thw"]}
    inputs["mm_token_type_ids"] = (ids == merged.config.image_token_id).int()
    answer = merged.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False, **inputs
    )
    assert answer.shape[1] == ids.shape[1] + 4
    base = AutoModelForImageTextToText.from_pretrained(qwen25_vl, dtype=torch.float32)
    adapter = PeftModel.from_pretrained(base, final).eval()
    with torch.no_grad():
        ours, theirs = merged(input_ids=ids, **inputs).logits, adapter(input_ids=ids, **inputs).logits
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_the_evaluation_answers_image_prompts_beside_the_base_model(two_ranks: Run) -> None:
    run = two_ranks.spec.model_copy(update={})
    spec = run.config.model_copy(
        update={
            "eval": run.config.eval.model_copy(
                update={
                    "compare_base": True,
                    "generate": run.config.eval.generate.model_copy(update={"enabled": True, "max_new_tokens": 4}),
                }
            )
        }
    )
    rewritten = Run(run.model_copy(update={"config": spec}), two_ranks.spec_url)
    from storage.spec import publish_spec

    publish_spec(rewritten.spec)
    result = evaluate(rewritten, str(layout.final_dir(run.run)), 2)
    assert result["target_tokens"] > 0 and result["token_accuracy"] is not None
    answers = result["generate"]["answers"]
    assert answers and all(a["images"] and a["images"][0].endswith((".png", ".jpg")) for a in answers)
    assert all("<|image_pad|>" not in a["prompt"] and "<image>" in a["prompt"] for a in answers)
    assert "base_output" in answers[0] and result["base"]["generate"]["records"] == result["generate"]["records"]


def test_the_pipeline_registers_an_image_model_whose_card_shows_the_images(
    prefect_server, qwen25_vl: str, tmp_path: Path
) -> None:
    from config.loader import load_config
    from flows.finetune import finetune
    from storage.digest import digest_bytes

    cfg = load_config(
        None,
        [
            f"run.storage={tmp_path}",
            "run.name=vl-pipeline",
            f"model.name_or_path={qwen25_vl}",
            DEMO_SOURCE,
            "data.eval_ratio=0.2",
            "data.max_length=256",
            *STEPS,
            "launch.nnodes=1",
            "eval.generate.enabled=true",
            "eval.generate.max_new_tokens=4",
        ],
    )
    summary = finetune(cfg)
    card = (tmp_path / "runs" / "vl-pipeline" / "model_card.md").read_text()
    assert "| images |" in card and "6 distinct" in card and "AutoModelForImageTextToText" in card
    assert any(f"| {name}" in card for name in ("1.png", "2.png", "3.png", "4.jpg", "5.png", "6.png"))
    (entry_path,) = (tmp_path / "registry").glob("*/v0001.json")
    lineage = json.loads(entry_path.read_text())["lineage"]
    dataset = tmp_path / "datasets" / summary["dataset_id"]
    manifest = json.loads((dataset / "manifest.json").read_text())
    assert lineage["dataset_manifest_digest"] == digest_bytes((dataset / "manifest.json").read_bytes(), "blake3")
    images = [f for f in manifest["files"] if f["path"].startswith("images/")]
    assert len(images) == 6 and all(f["digest"] in f["path"] for f in images)  # each image's digest, in the lineage
