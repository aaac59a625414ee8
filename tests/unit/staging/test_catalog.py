"""A LLaMA-Factory dataset_info.json entry read as a source: its file relative to the json, its formatting, columns,
tags and cap; every entry it cannot use refused in one line naming the key, the file and the entry."""

from __future__ import annotations

import json

import pytest

from core.errors import UserError
from staging.catalog import Entry, is_reference, read_entry


def catalog(tmp_path, entries: dict) -> str:
    path = tmp_path / "lf" / "dataset_info.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entries))
    return str(path)


def test_an_entry_gives_its_file_format_mapping_and_cap(tmp_path) -> None:
    path = catalog(
        tmp_path,
        {
            "qa": {"file_name": "qa.json", "columns": {"prompt": "q", "response": "a"}, "num_samples": 50},
            "chat": {"file_name": "/data/chat.jsonl", "formatting": "sharegpt", "tags": {"role_tag": "speaker"}},
            "corpus": {"file_name": "s3://bucket/wiki.txt", "columns": {"prompt": "text"}},
        },
    )
    assert is_reference(f"{path}#qa") and not is_reference(path)
    assert read_entry(f"{path}#qa", "data.source", {}) == Entry(
        str(tmp_path / "lf" / "qa.json"), "alpaca", {"prompt": "q", "response": "a"}, {}, 50
    )
    chat = read_entry(f"{path}#chat", "data.source", {})
    assert (chat.source, chat.format, chat.tags) == ("/data/chat.jsonl", "sharegpt", {"role_tag": "speaker"})
    corpus = read_entry(f"{path}#corpus", "data.sources[1].source", {})
    assert (corpus.source, corpus.format) == ("s3://bucket/wiki.txt", "text")  # alpaca with only a prompt: text


@pytest.mark.parametrize(
    ("entries", "name", "reason"),
    [
        ({"a": {"file_name": "a.json", "formatting": "chatml"}}, "a", "formatting 'chatml' is not one of alpaca"),
        ({"a": {"file_name": "a.json", "columns": {"videos": "x"}}}, "a", "columns: unknown name 'videos'"),
        ({"a": {"formatting": "alpaca"}}, "a", "the entry has no file_name"),
        ({"a": {"ms_hub_url": "org/set"}}, "a", "the entry names a hub dataset (ms_hub_url: org/set)"),
        ({"a": {"file_name": "a.json"}}, "b", "no entry 'b' in the file; its entries: a"),
    ],
)
def test_an_entry_it_cannot_use_is_one_line(tmp_path, entries: dict, name: str, reason: str) -> None:
    path = catalog(tmp_path, entries)
    with pytest.raises(UserError) as info:
        read_entry(f"{path}#{name}", "data.eval_source", {})
    assert str(info.value).startswith(f"data.eval_source: {path}#{name}") and reason in str(info.value)


def test_a_missing_or_broken_catalog_names_the_file(tmp_path) -> None:
    missing = tmp_path / "none" / "dataset_info.json"
    with pytest.raises(UserError, match=rf"^data.source: {missing} does not exist; give the path of a LLaMA-Factory"):
        read_entry(f"{missing}#a", "data.source", {})
    broken = tmp_path / "dataset_info.json"
    broken.write_text('{"a": {"file_name": "a.json"},\n}')
    with pytest.raises(
        UserError, match=rf"^data.source: {broken} is not valid JSON \(trailing comma is not allowed, line \d+\)$"
    ):
        read_entry(f"{broken}#a", "data.source", {})
