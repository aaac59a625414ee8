"""Preference records tokenized into preference rows: a pair's prompt once, then its chosen and rejected answers with
targets on the answers only; KTO feedback's prompt and answer with its label; an over-long pair truncated as a unit
(the prompt from the left, both answers from the right) or dropped.

Then as staging writes them (stage_dataset with data.preference=pairs): a pair is one row holding its prompt once
(tokenized with the chat template, tools kept) and its chosen and rejected answers, targets on the answers only; KTO
feedback is a row of its prompt and answer with the label; an over-long pair truncated as a unit or dropped and counted;
supervised records, and pairs with KTO records in one dataset, refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from config.sections.run_data import DataConfig
from core.errors import UserError
from staging.pairs import encode_preference, is_preference, sequences
from staging.stage import stage_dataset
from staging.tokenize import EncoderSettings
from staging.tokenizer import load_tokenizer
from storage.location import Location
from storage.shards import IGNORE_INDEX, PAIR
from storage.split_reader import Shard, Split
from tests.datafiles import write_jsonl

PROMPT = [{"role": "user", "content": "Is the sky blue?"}]
PAIR_RECORD = {
    "messages": PROMPT,
    "chosen": [{"role": "assistant", "content": "Yes, on a clear day."}],
    "rejected": [{"role": "assistant", "content": "No, it is plaid."}],
}
FEEDBACK = {"messages": [*PROMPT, {"role": "assistant", "content": "Yes."}], "desirable": False}


@pytest.fixture(scope="module")
def encoder(tiny_model):
    return EncoderSettings(tiny_model, max_length=256).encoder()


def test_a_pair_is_its_prompt_once_then_both_answers_each_rendered_with_the_prompt(encoder) -> None:
    assert is_preference(PAIR_RECORD) and is_preference(FEEDBACK) and not is_preference({"messages": PROMPT})
    batch = encode_preference(encoder, [("p.jsonl:1", PAIR_RECORD)])
    [(prompt, chosen, rejected)] = batch.segments.tolist()
    ids, labels = batch.ids.tolist(), batch.labels.tolist()
    assert len(ids) == prompt + chosen + rejected and batch.feedback.tolist() == [PAIR]
    assert labels[:prompt] == [IGNORE_INDEX] * prompt  # the prompt is never a target
    assert labels[prompt:] == ids[prompt:]  # every answer token is
    # Each answer as the model reads it: the prompt's tokens, then the answer's, as the template renders them.
    conversations, _ = sequences(PAIR_RECORD)
    for conversation, (start, stop) in zip(
        conversations, [(prompt, prompt + chosen), (prompt + chosen, len(ids))], strict=True
    ):
        whole = encoder.encode([conversation])
        assert whole.ids.tolist()[: prompt + stop - start] == ids[:prompt] + ids[start:stop]


def test_feedback_is_its_prompt_and_answer_with_its_label(encoder) -> None:
    batch = encode_preference(encoder, [("k.jsonl:1", FEEDBACK)])
    [(prompt, answer, none)] = batch.segments.tolist()
    assert none == 0 and batch.feedback.tolist() == [0] and len(batch.ids) == prompt + answer


def test_an_over_long_pair_is_truncated_as_a_unit_or_dropped(tiny_model, encoder) -> None:
    whole = encode_preference(encoder, [("p.jsonl:1", PAIR_RECORD)])
    [(prompt, chosen, rejected)] = whole.segments.tolist()
    limit = prompt + max(chosen, rejected) - 4
    short = EncoderSettings(tiny_model, max_length=limit).encoder()
    cut = encode_preference(short, [("p.jsonl:1", PAIR_RECORD)])
    [(kept_prompt, kept_chosen, kept_rejected)] = cut.segments.tolist()
    assert cut.truncated.tolist() == [True] and kept_prompt + max(kept_chosen, kept_rejected) == limit
    assert cut.ids.tolist()[:kept_prompt] == whole.ids.tolist()[prompt - kept_prompt : prompt]  # the prompt's end
    assert (
        cut.ids.tolist()[kept_prompt : kept_prompt + kept_chosen] == whole.ids.tolist()[prompt : prompt + kept_chosen]
    )
    dropping = EncoderSettings(tiny_model, max_length=limit, excess_length="drop").encoder()
    dropped = encode_preference(dropping, [("p.jsonl:1", PAIR_RECORD), ("k.jsonl:1", FEEDBACK)])
    assert dropped.kept.tolist() == [1] and dropped.dropped[0][0] == 0
    assert f"longer than data.max_length={limit}" in dropped.dropped[0][1]


# Staged through stage_dataset (data.preference=pairs), as the pipeline stages them.
Q, C, R = "Is the sky blue?", "Yes, on a clear day.", "No, it is plaid."
STAGED_PAIR = {
    "messages": [{"role": "user", "content": Q}],
    "chosen": {"role": "assistant", "content": C},
    "rejected": {"role": "assistant", "content": R},
}


def stage_pairs(source: Path, storage: Path, tokenizer: str, **settings: object):
    data = DataConfig(source=str(source), preference="pairs", eval_ratio=0, **{"max_length": 256, **settings})
    return stage_dataset(data, Location(str(storage)), tokenizer, bars=False)


def staged_rows_of(ref) -> pa.Table:
    return pa.ipc.open_file(Path(ref.url) / "train" / "shard-00000.arrow").read_all()


def manifest_of(ref) -> dict:
    return json.loads((Path(ref.url) / "manifest.json").read_text())


def test_a_pair_is_one_row_its_prompt_once_and_both_answers_as_targets(tmp_path, tiny_model) -> None:
    tools = [{"type": "function", "function": {"name": "weather_lookup", "parameters": {"type": "object"}}}]
    ref = stage_pairs(
        write_jsonl(tmp_path / "p.jsonl", [STAGED_PAIR, {**STAGED_PAIR, "tools": tools}]), tmp_path, tiny_model
    )
    tok = load_tokenizer(tiny_model)
    table = staged_rows_of(ref)
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
    counts = manifest_of(ref)["splits"]["train"]
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
    ref = stage_pairs(write_jsonl(tmp_path / "k.jsonl", records), tmp_path, tiny_model)
    tok = load_tokenizer(tiny_model)
    table = staged_rows_of(ref)
    assert table.column("feedback").to_pylist() == [1, 0]
    for ids, segments, answer in zip(
        table.column("input_ids").to_pylist(), table.column("segments").to_pylist(), (C, R), strict=True
    ):
        prompt, size, empty = segments
        assert empty == 0 and prompt + size == len(ids) and tok.decode(ids[prompt:]) == f"{answer}<|im_end|>\n"
    counts = manifest_of(ref)["splits"]["train"]
    assert (counts["pairs"], counts["desirable"], counts["undesirable"]) == (0, 1, 1)


PAIR_LIMIT = 64  # the short pair (about 40 tokens with the template's system prompt) fits; the long one does not


def long_staged_pair() -> dict:
    return {**STAGED_PAIR, "messages": [{"role": "user", "content": " ".join(["context"] * 60) + " " + Q}]}


def test_an_over_long_pair_is_truncated_as_a_unit(tmp_path, tiny_model) -> None:
    ref = stage_pairs(
        write_jsonl(tmp_path / "p.jsonl", [long_staged_pair(), STAGED_PAIR]),
        tmp_path,
        tiny_model,
        max_length=PAIR_LIMIT,
    )
    tok = load_tokenizer(tiny_model)
    table = staged_rows_of(ref)
    lengths = [(p + max(c, r), p) for p, c, r in table.column("segments").to_pylist()]
    assert all(need <= PAIR_LIMIT for need, _ in lengths)
    long_row = table.column("input_ids").to_pylist()[0]
    p, c, _ = table.column("segments").to_pylist()[0]
    # The prompt lost its start, not its end; both answers kept whole (they fit beside the prompt's end).
    assert tok.decode(long_row[:p]).endswith(f"{Q}<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(long_row[p : p + c]) == f"{C}<|im_end|>\n" and tok.decode(long_row[p + c :]) == f"{R}<|im_end|>\n"
    assert manifest_of(ref)["splits"]["train"]["truncated"] == 1


def test_an_over_long_pair_is_dropped_and_counted(tmp_path, tiny_model) -> None:
    source = write_jsonl(tmp_path / "p.jsonl", [long_staged_pair(), STAGED_PAIR])
    ref = stage_pairs(source, tmp_path, tiny_model, max_length=PAIR_LIMIT, excess_length="drop")
    doc = manifest_of(ref)
    assert doc["records"]["dropped"] == 1 and doc["splits"]["train"]["pairs"] == 1
    [line] = (Path(ref.url) / "rejects.jsonl").read_text().splitlines()
    reject = json.loads(line)
    assert reject["location"] == f"{source}:1"
    assert reject["reason"].endswith(
        f"tokens (prompt and longer answer), longer than data.max_length={PAIR_LIMIT} (data.excess_length=drop)"
    )


def test_supervised_records_are_refused_in_one_line(tmp_path, tiny_model) -> None:
    source = write_jsonl(
        tmp_path / "s.jsonl", [{"messages": [{"role": "user", "content": Q}, {"role": "assistant", "content": C}]}]
    )
    with pytest.raises(UserError) as info:
        stage_pairs(source, tmp_path, tiny_model)
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
    write_jsonl(folder / "pairs.jsonl", [STAGED_PAIR] * 4)
    feedback = {"prompt": [{"role": "user", "content": Q}], "completion": [{"role": "assistant", "content": C}]}
    write_jsonl(folder / "kto.jsonl", [{**feedback, "label": True}, {**feedback, "label": False}])
    with pytest.raises(UserError) as info:
        stage_pairs(folder, tmp_path / "storage", tiny_model)
    message = str(info.value)
    assert "4 preference pairs and 2 KTO records" in message and "stage them as two datasets" in message
    assert "\n" not in message
    assert not list((tmp_path / "storage").rglob("manifest.json"))
