"""Sequence packing (data.packing): rows packed first-fit decreasing at prepare time, each example's boundaries in
the shards, and the model seeing each example of a packed row exactly as it sees the example alone, in the
training loss and in the evaluation, on chat and tool-calling data."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from config.methods import FULL
from config.sections.launch import LaunchConfig
from config.sections.run_data import DataConfig
from flows.prepare import summary_rows
from staging.packing import first_fit_decreasing, packing_enabled
from staging.stage import stage_dataset
from storage.local_dataset import open_split
from storage.location import Location
from storage.manifest import read_manifest
from storage.node_cache import node_cache
from storage.shards import Row, examples_of
from tests.datafiles import SAMPLE
from tests.distributed.harness import tool_call_conversations
from trainer.data import collate
from trainer.loss.chunked import LossHead
from trainer.objectives.base import EvalOptions
from trainer.objectives.policy import Policy
from trainer.objectives.sft import EvalRows, local_sums, summed_loss

CPU = torch.device("cpu")


def load_split(url: str, split: str) -> list[Row]:
    """Every row of a local split, read as the ranks read it (mapped in place)."""
    return list(open_split(Location(str(url)), split, node_cache(LaunchConfig())))


def test_first_fit_decreasing_fills_rows_in_a_fixed_order() -> None:
    lengths = np.array([5, 9, 2, 7, 3, 9, 1, 4])
    rows = first_fit_decreasing(lengths, 10)
    # Longest first, ties by index; each goes to the first row with room: 9(1) 9(5) 7(3) 5(0) 4(7) 3(4) 2(2) 1(6).
    assert rows == [[1, 6], [5], [3, 4], [0, 7], [2]]
    assert all(sum(lengths[i] for i in row) <= 10 for row in rows)
    many = np.random.default_rng(0).integers(1, 128, size=5000)
    packed = first_fit_decreasing(many, 128)
    assert sorted(i for row in packed for i in row) == list(range(5000))
    assert max(sum(many[i] for i in row) for row in packed) <= 128
    assert packed == first_fit_decreasing(many.copy(), 128)
    # First fit never leaves two rows that could have been one: at most one row is half full or less.
    assert sum(1 for row in packed if sum(many[i] for i in row) <= 64) <= 1


@pytest.mark.parametrize(
    ("setting", "formats", "packed"),
    [
        (None, ["qwen"], False),
        (None, ["text"], True),
        (None, ["text", "qwen"], False),
        (True, ["sharegpt"], True),
        (False, ["text"], False),
    ],
)
def test_packing_is_on_for_plain_text_unless_set(setting: bool | None, formats: list[str], packed: bool) -> None:
    assert packing_enabled(DataConfig(packing=setting), formats) is packed


def text_records(n: int) -> list[dict[str, str]]:
    return [{"text": f"note {i}: " + "two plus two is four. " * (1 + i % 5)} for i in range(n)]


@pytest.mark.parametrize("how", ["data.format", "data.sources", "dataset_info.json", "detected", "chat"])
def test_packing_unset_follows_the_resolved_format_of_every_input(how: str, tmp_path, tiny_model) -> None:
    # Plain text packs by default however its format is known: set in data.format or a data.sources entry, from a
    # dataset_info.json entry (an alpaca entry whose only column is prompt), or detected; chat data does not.
    source = tmp_path / "notes.jsonl"
    records = json.loads(SAMPLE.read_text())[:40] if how == "chat" else text_records(40)
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "dataset_info.json").write_text(
        json.dumps({"notes": {"file_name": "notes.jsonl", "formatting": "alpaca", "columns": {"prompt": "text"}}})
    )
    data = {
        "data.format": DataConfig(source=str(source), format="text"),
        "data.sources": DataConfig(sources=[{"source": str(source), "format": "text"}]),
        "dataset_info.json": DataConfig(source=f"{tmp_path / 'dataset_info.json'}#notes"),
        "detected": DataConfig(source=str(source)),
        "chat": DataConfig(source=str(source)),
    }[how]
    ref = stage_dataset(
        data.model_copy(update={"max_length": 128, "eval_ratio": 0.2}),
        Location(str(tmp_path / "s")),
        tiny_model,
        progress=lambda _: None,
        bars=False,
    )
    manifest = read_manifest(Location(ref.url), "tandem.dataset/1")[0]
    assert manifest["packing"] is (how != "chat")
    assert [name for name, _ in summary_rows(ref, Location(str(tmp_path / "s")))].count("packing") == (how != "chat")


@pytest.fixture(scope="module")
def both(tmp_path_factory, tiny_model) -> dict[bool, object]:
    """The same records (60 sample conversations and 12 tool-calling ones) staged unpacked and packed."""
    source = tmp_path_factory.mktemp("pack-source")
    records = json.loads(SAMPLE.read_text())[:60]
    (source / "chat.json").write_text(json.dumps(records))
    (source / "tools.json").write_text(json.dumps(tool_call_conversations(12)))
    storage = tmp_path_factory.mktemp("pack-storage")
    return {
        packing: stage_dataset(
            DataConfig(source=str(source), max_length=512, eval_ratio=0.25, packing=packing),
            Location(str(storage)),
            tiny_model,
            progress=lambda _: None,
            bars=False,
        )
        for packing in (False, True)
    }


def as_examples(rows: list[Row]) -> Counter:
    return Counter((tuple(e.input_ids), tuple(e.labels)) for e in examples_of(rows))


def test_packed_shards_hold_the_same_examples_in_fewer_rows(both) -> None:
    unpacked, packed = both[False], both[True]
    assert unpacked.dataset_id != packed.dataset_id
    plain, _ = read_manifest(Location(unpacked.url), "tandem.dataset/1")
    manifest, _ = read_manifest(Location(packed.url), "tandem.dataset/1")
    assert (plain["packing"], manifest["packing"]) == (False, True)
    for split in ("train", "eval"):
        rows, reference = load_split(packed.url, split), load_split(unpacked.url, split)
        assert as_examples(rows) == as_examples(reference)
        assert all(sum(row.segments) == len(row.input_ids) <= 512 for row in rows)
        assert any(len(row.segments) > 1 for row in rows)
        counts = manifest["splits"][split]
        assert counts["rows"] == len(rows) < len(reference) == counts["records"] == plain["splits"][split]["records"]
        for key in ("tokens", "target_tokens"):
            assert counts[key] == plain["splits"][split][key]
    # A global batch counts rows: the reference a run's step count comes from carries the packed rows.
    assert packed.split_records == {
        "train": manifest["splits"]["train"]["rows"],
        "eval": manifest["splits"]["eval"]["rows"],
    }
    splits = manifest["splits"]
    storage = Location(str(Path(packed.url).parents[1]))  # {storage}/datasets/{id}
    assert dict(summary_rows(packed, storage))["packing"] == (
        f"train {splits['train']['records']} records in {splits['train']['rows']} rows, eval "
        f"{splits['eval']['records']} records in {splits['eval']['rows']} rows of up to 512 tokens"
    )
    assert "packing" not in dict(summary_rows(unpacked, storage))


def test_packing_is_fixed_by_the_dataset_id(both, tmp_path, tiny_model) -> None:
    source = Path(read_manifest(Location(both[True].url), "tandem.dataset/1")[0]["sources"][0]["url"]).parent
    copy = tmp_path / "moved"
    shutil.copytree(source, copy)
    ref = stage_dataset(
        DataConfig(source=str(copy), max_length=512, eval_ratio=0.25, packing=True),
        Location(str(tmp_path / "s")),
        tiny_model,
        progress=lambda _: None,
        bars=False,
    )
    assert ref.dataset_id == both[True].dataset_id
    for split in ("train", "eval"):
        assert load_split(ref.url, split) == load_split(both[True].url, split)


@pytest.fixture(scope="module")
def model(tiny_model):
    from trainer.model.load import load_base

    return load_base(tiny_model, method=FULL, bf16=False).eval()


@pytest.mark.parametrize("chunk_tokens", [0, 64])  # full logits, and the chunked loss (train.loss_chunk_tokens)
def test_a_packed_rows_training_loss_is_the_sum_of_its_examples_alone(both, model, chunk_tokens: int) -> None:
    rows = [row for row in load_split(both[True].url, "train") if len(row.segments) > 1]
    tool_rows = [row for row in rows if any(len(e.input_ids) > 200 for e in examples_of([row]))]
    assert tool_rows, "no packed row holds a tool-calling conversation"
    pad_id = int(model.config.pad_token_id)
    head = LossHead.of(model, chunk_tokens)
    # Plain text's labels (every token a target): an example's first token must not be predicted from the end of
    # the one before it.
    first, second = examples_of(rows[:1])[:2]
    text = Row(
        first.input_ids + second.input_ids,
        first.input_ids + second.input_ids,
        [len(first.input_ids), len(second.input_ids)],
    )
    # One packed row, a micro-batch of two packed rows of different lengths (padding after the shorter), and text.
    for batch_rows in ([tool_rows[0]], [rows[0], rows[-1]], [text]):
        packed = collate(batch_rows, pad_id)
        assert packed.position_ids is not None
        alone = [collate([example], pad_id) for example in examples_of(batch_rows)]
        assert packed.target_tokens == sum(batch.target_tokens for batch in alone)
        weight = model.model.layers[0].self_attn.q_proj.weight
        loss = summed_loss(Policy(model, CPU), packed, head)
        (grad,) = torch.autograd.grad(loss, weight)
        separate = [summed_loss(Policy(model, CPU), batch, head) for batch in alone]
        (separate_grad,) = torch.autograd.grad(sum(separate), weight)
        torch.testing.assert_close(loss, sum(separate), rtol=1e-5, atol=0)
        torch.testing.assert_close(grad, separate_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("chunk_tokens", [0, 64])
def test_packed_and_unpacked_eval_give_the_same_metrics(both, model, chunk_tokens: int) -> None:
    pad_id = int(model.config.pad_token_id)
    packed_rows, plain_rows = load_split(both[True].url, "eval"), load_split(both[False].url, "eval")
    assert len(packed_rows) < len(plain_rows)
    packed, plain = (
        local_sums(model, rows, EvalRows(range(len(rows)), 0, 1), EvalOptions(4, pad_id), CPU, chunk_tokens)
        for rows in (packed_rows, plain_rows)
    )
    assert packed[0] == pytest.approx(plain[0], rel=1e-5)
    assert packed[1:] == plain[1:]  # target tokens, correct tokens, examples


def in_memory_batches(rows: list[Row], seed: int, step: int, rank: int, world: int) -> list:
    """A step's micro-batches for one rank as the in-memory reader gave them: every row of the split in a list, and
    the epoch's order shuffled again at every step (the way before the shards were memory-mapped)."""
    import random

    from trainer.data import deal_by_length

    per_step, indices, position = 2 * 3 * world, [], step * 2 * 3 * world
    while len(indices) < per_step:
        epoch, offset = divmod(position, len(rows))
        order = list(range(len(rows)))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        take = min(per_step - len(indices), len(rows) - offset)
        indices += order[offset : offset + take]
        position += take
    lengths = {i: len(rows[i].input_ids) for i in indices}
    return [collate([rows[i] for i in group], 0) for group in deal_by_length(indices, lengths, 2, 3, world, step)[rank]]


def whole_split(url: str) -> list[Row]:
    """The train split read whole into lists, as the reader before the memory map held it."""
    import pyarrow as pa

    manifest, _ = read_manifest(Location(str(url)), "tandem.dataset/1")
    rows = []
    for entry in (e for e in manifest["files"] if e["path"].startswith("train/")):
        columns = pa.ipc.open_file(Path(url) / entry["path"]).read_all().to_pydict()
        segments = columns.get("segments") or [[n] for n in columns["length"]]
        rows += [Row(*row) for row in zip(columns["input_ids"], columns["labels"], segments, strict=True)]
    return rows


def same_batch(ours, theirs) -> bool:
    """The same tensors, position ids (packed rows) included."""
    fields = ("input_ids", "labels", "attention_mask")
    same_positions = (
        ours.position_ids is None
        if theirs.position_ids is None
        else bool(torch.equal(ours.position_ids, theirs.position_ids))
    )
    return same_positions and all(torch.equal(getattr(ours, f), getattr(theirs, f)) for f in fields)


@pytest.mark.parametrize("packing", [False, True])
def test_every_rank_sees_the_rows_the_in_memory_reader_gave_it(both, packing: bool) -> None:
    """Each step's micro-batches on every rank, over more than two epochs, on 1 and 3 ranks: the same tensors from
    the memory-mapped shards as from the whole split read into lists."""
    from trainer.data import Dealing, GlobalOrder, rank_micro_batches

    split = open_split(Location(both[packing].url), "train", node_cache(LaunchConfig()))
    rows = whole_split(both[packing].url)
    manifest, _ = read_manifest(Location(both[packing].url), "tandem.dataset/1")
    assert list(split) == rows and split.examples == manifest["splits"]["train"]["records"]
    for world in (1, 3):
        order = GlobalOrder(len(split), seed=11)
        for step in range(2 * len(rows) // (6 * world) + 2):  # into the third epoch
            for rank in range(world):
                ours = rank_micro_batches(split, order, Dealing(step, 2, 3, rank, world, 0))
                theirs = in_memory_batches(rows, 11, step, rank, world)
                assert all(same_batch(a, b) for a, b in zip(ours, theirs, strict=True)), (world, step, rank)


def test_packed_image_rows_keep_their_examples_images_in_order(tmp_path: Path, qwen25_vl: str) -> None:
    """data.packing on image records: rows of max_length by their real lengths (the images' tokens counted), each
    row's images those of its examples in their order, one run of image tokens per image."""
    demo = Path(__file__).resolve().parents[3] / "data" / "mllm_demo"
    data = DataConfig(source=f"{demo}/dataset_info.json#mllm_demo", max_length=256, eval_ratio=0.0, packing=True)
    ref = stage_dataset(data, Location(str(tmp_path)), qwen25_vl, progress=lambda _: None, bars=False)
    manifest = json.loads((Path(ref.url) / "manifest.json").read_text())
    assert manifest["packing"] and manifest["splits"]["train"]["rows"] < 24 == manifest["splits"]["train"]["records"]
    token = json.loads((Path(qwen25_vl) / "config.json").read_text())["image_token_id"]
    rows = pa.ipc.open_file(Path(ref.url) / "train" / "shard-00000.arrow").read_all().to_pylist()
    assert all(row["length"] <= 256 for row in rows)
    for row in rows:
        ids = row["input_ids"]
        runs = [i for i, t in enumerate(ids) if t == token and (i == 0 or ids[i - 1] != token)]
        assert len(runs) == len(row["images"]) == len(row["image_tokens"])
        assert sum(t == token for t in ids) == sum(row["image_tokens"])
    assert sum(len(row["images"]) for row in rows) == 30
