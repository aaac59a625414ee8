"""A data file's records as staging reads them: the format decided once from its first records, each record renamed by
the mapping and normalized, or kept out with its location and the reason in the user's own keys."""

from __future__ import annotations

import pytest

from core.errors import UserError
from staging.mapping import Mapping
from staging.records import Reading, Record, Reject, Undesirable, file_format, open_file, to_item
from storage.location import Location
from tests.datafiles import write_jsonl

CHAT = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
PAIR = {"messages": [{"role": "user", "content": "2+2?"}], "chosen": "4", "rejected": "5"}


def read(path, mapping: Mapping, preference: str = "refuse") -> tuple[str, list]:
    data = open_file(Location(str(path)), mapping, preference, lambda _: None)
    return data.format, list(data.items)


def test_the_format_is_decided_from_the_first_records_and_bad_ones_are_kept_out(tmp_path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [CHAT, {"messages": []}, CHAT])
    fmt, items = read(path, Mapping("auto"))
    assert fmt == "openai" and [type(i) for i in items] == [Record, Reject, Record]
    assert items[0] == Record(f"{path}:1", {"messages": CHAT["messages"]})
    assert items[1] == Reject(f"{path}:2", "no assistant turn")
    assert items[1].error().args[0].endswith("(or set data.on_invalid=skip to skip invalid records)")
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    assert read(empty, Mapping("auto")) == ("auto", [])


def test_a_reason_is_told_in_the_users_keys(tmp_path) -> None:
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "2+2?", "answer": ""}])
    _, [reject] = read(path, Mapping("alpaca", {"prompt": "question", "response": "answer"}))
    assert isinstance(reject, Reject) and reject.reason.startswith("answer (column response):")


def test_preference_data_is_refused_kept_to_its_desirable_side_or_staged_as_pairs(tmp_path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [PAIR])
    with pytest.raises(UserError, match=rf"^{path}: preference data \(LLaMA-Factory's OpenAI-style pairs: columns "):
        read(path, Mapping("auto"))
    _, [chosen] = read(path, Mapping("auto"), "chosen")
    assert chosen.conversation["messages"][-1] == {"role": "assistant", "content": "4"}
    _, [pair] = read(path, Mapping("auto"), "pairs")
    assert pair.conversation["rejected"] == [{"role": "assistant", "content": "5"}]
    supervised = write_jsonl(tmp_path / "s.jsonl", [CHAT])
    with pytest.raises(UserError, match=rf"^{supervised}: its first records are not preference data"):
        read(supervised, Mapping("auto"), "pairs")


def test_feedback_labelled_false_is_left_out_of_supervised_data_not_rejected() -> None:
    reading = Reading("openai", Mapping("openai", {"kto_tag": "good"}), "chosen")
    item = to_item("f.jsonl:3", {**CHAT, "good": False}, reading)
    assert isinstance(item, Undesirable) and "labelled undesirable (good: false)" in item.reason


def test_a_txt_file_is_plain_text_and_a_given_format_is_taken(tmp_path) -> None:
    assert file_format(Location("/d/notes.txt"), "auto", [], None) == ("text", "a .txt file: one example a line")
    with pytest.raises(UserError, match=r"notes.txt: a .txt file is plain text, one example a line, not openai"):
        file_format(Location("/d/notes.txt"), "openai", [], None)
    assert file_format(Location("/d/a.jsonl"), "sharegpt", [CHAT], None) == ("sharegpt", "data.format")
