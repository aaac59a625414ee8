"""Preference data staged for a preference objective (data.preference=pairs): a pair is one row holding its prompt
once (tokenized with the chat template, tools kept) and its chosen and rejected answers, targets on the answers only;
KTO feedback is a row of its prompt and answer with the label; an over-long pair is truncated as a unit or dropped
and counted; supervised records, and pairs with KTO records in one dataset, are refused in one line. The config's
checks of an objective against its data are tests/unit/config/test_objectives.py's, the trainer's against the staged
rows tests/unit/trainer/objectives/test_base.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from config.sections.run_data import DataConfig
from core.errors import UserError
from staging.stage import stage_dataset
from staging.tokenizer import load_tokenizer
from storage.location import Location
from storage.shards import IGNORE_INDEX, PAIR
from storage.split_reader import Shard, Split
from tests.datafiles import write_jsonl

Q, C, R = "Is the sky blue?", "Yes, on a clear day.", "No, it is plaid."
PAIR_RECORD = {
    "messages": [{"role": "user", "content": Q}],
    "chosen": {"role": "assistant", "content": C},
    "rejected": {"role": "assistant", "content": R},
}


def stage(source: Path, storage: Path, tokenizer: str, **settings: object):
    data = DataConfig(source=str(source), preference="pairs", eval_ratio=0, **{"max_length": 256, **settings})
    return stage_dataset(data, Location(str(storage)), tokenizer, bars=False)


def rows(ref) -> pa.Table:
    return pa.ipc.open_file(Path(ref.url) / "train" / "shard-00000.arrow").read_all()


def manifest(ref) -> dict:
    return json.loads((Path(ref.url) / "manifest.json").read_text())


def test_a_pair_is_one_row_its_prompt_once_and_both_answers_as_targets(tmp_path, tiny_model) -> None:
    tools = [{"type": "function", "function": {"name": "weather_lookup", "parameters": {"type": "object"}}}]
    ref = stage(write_jsonl(tmp_path / "p.jsonl", [PAIR_RECORD, {**PAIR_RECORD, "tools": tools}]), tmp_path, tiny_model)
    tok = load_tokenizer(tiny_model)
    table = rows(ref)
    assert table.column_names == ["input_ids", "labels", "length", "segments", "feedback"]
    for ids, labels, segments, feedback in zip(
        *(table.column(k).to_pylist() for k in ("input_ids", "labels", "segments", "feedback")), strict=True
    ):
        prompt, chosen, rejected = segments
        assert feedback == PAIR and prompt + chosen + rejected == len(ids)
        assert labels[:prompt] == [IGNORE_INDEX] * prompt  # the prompt is context, never a target
        assert labels[prompt:] == ids[prompt:]  # every answer token is a target
        text = tok.decode(ids[:prompt])
        assert text.count(Q) == 1 and text.endswith("<|im_start|>assistant\n")
        assert tok.decode(ids[prompt : prompt + chosen]) == f"{C}<|im_end|>\n"
        assert tok.decode(ids[prompt + chosen :]) == f"{R}<|im_end|>\n"
    assert "weather_lookup" in tok.decode(table.column("input_ids").to_pylist()[1])  # tools kept in the prompt
    counts = manifest(ref)["splits"]["train"]
    assert (counts["records"], counts["rows"], counts["pairs"], counts["desirable"]) == (2, 2, 2, 0)
    split = Split([Shard(Path(ref.url) / "train" / "shard-00000.arrow")], 2)
    assert split.preference and split.feedback(0) == PAIR and split[0].segments == table.column("segments")[0].as_py()


def test_kto_feedback_is_a_row_of_prompt_and_answer_with_its_label(tmp_path, tiny_model) -> None:
    records = [
        {
            "prompt": [{"role": "user", "content": Q}],
            "completion": [{"role": "assistant", "content": C}],
            "label": True,
        },
        {
            "prompt": [{"role": "user", "content": Q}],
            "completion": [{"role": "assistant", "content": R}],
            "label": False,
        },
    ]
    ref = stage(write_jsonl(tmp_path / "k.jsonl", records), tmp_path, tiny_model)
    tok = load_tokenizer(tiny_model)
    table = rows(ref)
    assert table.column("feedback").to_pylist() == [1, 0]
    for ids, segments, answer in zip(
        table.column("input_ids").to_pylist(), table.column("segments").to_pylist(), (C, R), strict=True
    ):
        prompt, size, empty = segments
        assert empty == 0 and prompt + size == len(ids) and tok.decode(ids[prompt:]) == f"{answer}<|im_end|>\n"
    counts = manifest(ref)["splits"]["train"]
    assert (counts["pairs"], counts["desirable"], counts["undesirable"]) == (0, 1, 1)


LIMIT = 64  # the short pair (about 40 tokens with the template's system prompt) fits; the long one does not


def long_pair() -> dict:
    return {**PAIR_RECORD, "messages": [{"role": "user", "content": " ".join(["context"] * 60) + " " + Q}]}


def test_an_over_long_pair_is_truncated_as_a_unit(tmp_path, tiny_model) -> None:
    ref = stage(write_jsonl(tmp_path / "p.jsonl", [long_pair(), PAIR_RECORD]), tmp_path, tiny_model, max_length=LIMIT)
    tok = load_tokenizer(tiny_model)
    table = rows(ref)
    lengths = [(p + max(c, r), p) for p, c, r in table.column("segments").to_pylist()]
    assert all(need <= LIMIT for need, _ in lengths)
    long_row = table.column("input_ids").to_pylist()[0]
    p, c, _ = table.column("segments").to_pylist()[0]
    # The prompt lost its start, not its end; both answers kept whole (they fit beside the prompt's end).
    assert tok.decode(long_row[:p]).endswith(f"{Q}<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(long_row[p : p + c]) == f"{C}<|im_end|>\n" and tok.decode(long_row[p + c :]) == f"{R}<|im_end|>\n"
    assert manifest(ref)["splits"]["train"]["truncated"] == 1


def test_an_over_long_pair_is_dropped_and_counted(tmp_path, tiny_model) -> None:
    source = write_jsonl(tmp_path / "p.jsonl", [long_pair(), PAIR_RECORD])
    ref = stage(source, tmp_path, tiny_model, max_length=LIMIT, excess_length="drop")
    doc = manifest(ref)
    assert doc["records"]["dropped"] == 1 and doc["splits"]["train"]["pairs"] == 1
    [line] = (Path(ref.url) / "rejects.jsonl").read_text().splitlines()
    reject = json.loads(line)
    assert reject["location"] == f"{source}:1"
    assert reject["reason"].endswith(
        f"tokens (prompt and longer answer), longer than data.max_length={LIMIT} (data.excess_length=drop)"
    )


def test_supervised_records_are_refused_in_one_line(tmp_path, tiny_model) -> None:
    source = write_jsonl(
        tmp_path / "s.jsonl", [{"messages": [{"role": "user", "content": Q}, {"role": "assistant", "content": C}]}]
    )
    with pytest.raises(UserError) as info:
        stage(source, tmp_path, tiny_model)
    assert str(info.value) == (
        f"{source}: its first records are not preference data (no 'chosen'/'rejected' answers, no KTO label); "
        "data.preference=pairs stages pairs and KTO feedback only: give it in its own run, with "
        "data.preference=chosen or refuse"
    )


def test_pairs_and_kto_records_together_are_refused_in_one_line(tmp_path, tiny_model) -> None:
    """A directory of a pairs file and a KTO file: no one objective trains both, so staging stops, before the
    manifest (the dataset is never complete)."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    write_jsonl(folder / "pairs.jsonl", [PAIR_RECORD] * 4)
    feedback = {"prompt": [{"role": "user", "content": Q}], "completion": [{"role": "assistant", "content": C}]}
    write_jsonl(folder / "kto.jsonl", [{**feedback, "label": True}, {**feedback, "label": False}])
    with pytest.raises(UserError) as info:
        stage(folder, tmp_path / "storage", tiny_model)
    message = str(info.value)
    assert "4 preference pairs and 2 KTO records" in message and "stage them as two datasets" in message
    assert "\n" not in message
    assert not list((tmp_path / "storage").rglob("manifest.json"))
