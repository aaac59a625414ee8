"""Data whose keys differ (data.columns, data.tags), LLaMA-Factory's dataset_info.json entries, and several
sources mixed (data.sources: concat or interleave by weight, caps), with each source's counts in the manifest."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from config.loader import load_config
from config.sections.run_data import DataConfig
from core.errors import UserError
from staging.stage import stage_dataset
from staging.streams import capped, interleave, resolve
from storage.location import Location
from storage.manifest import read_manifest
from tests.datafiles import arithmetic, read_records, write_json, write_jsonl

EXPECTED = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": "5."},
    ]
}
RENAMED_ALPACA = {"question": "Add 2", "context": "and 3.", "answer": "5.", "sys": "Be brief."}
ALPACA_COLUMNS = {"prompt": "question", "query": "context", "response": "answer", "system": "sys"}
RENAMED_CHAT = {
    "dialog": [
        {"speaker": "sys", "text": "Be brief."},
        {"speaker": "me", "text": "Add 2 and 3."},
        {"speaker": "bot", "text": "5."},
    ]
}
CHAT_TAGS = {
    "role_tag": "speaker",
    "content_tag": "text",
    "user_tag": "me",
    "assistant_tag": "bot",
    "system_tag": "sys",
}


def read(source: str, data: DataConfig) -> list[dict]:
    [stream] = resolve(data.model_copy(update={"source": source}))
    return [r.conversation for r in read_records(stream.source, stream.mapping.format, stream.mapping)]


def test_columns_and_tags_rename_a_formats_keys(tmp_path) -> None:
    alpaca = write_jsonl(tmp_path / "a.jsonl", [RENAMED_ALPACA])
    data = DataConfig(format="alpaca", columns=ALPACA_COLUMNS)
    assert read(alpaca, data) == [
        {"messages": [EXPECTED["messages"][0], {"role": "user", "content": "Add 2\nand 3."}, EXPECTED["messages"][2]]}
    ]
    chat = write_jsonl(tmp_path / "c.jsonl", [RENAMED_CHAT])
    for fmt in ("sharegpt", "openai", "qwen"):
        assert read(chat, DataConfig(format=fmt, columns={"messages": "dialog"}, tags=CHAT_TAGS)) == [EXPECTED], fmt
    text = write_jsonl(tmp_path / "t.jsonl", [{"body": "Once upon a time."}])
    assert read(text, DataConfig(format="text", columns={"prompt": "body"})) == [{"text": "Once upon a time."}]
    # Bad input keeps its location and names the format's own field.
    bad = write_jsonl(tmp_path / "b.jsonl", [RENAMED_ALPACA, {**RENAMED_ALPACA, "answer": 5}])
    with pytest.raises(UserError, match=rf"^{bad}:2: answer \(column response\): expected a string, got int "):
        read(bad, data)
    with pytest.raises(
        UserError,
        match=r"^data.source: column 'query' is not one of format sharegpt's: messages, "
        r"system, tools, images, chosen, rejected, kto_tag$",
    ):
        read(chat, DataConfig(format="sharegpt", columns={"query": "x"}))
    with pytest.raises(ValidationError, match=r"data.columns/tags rename the keys of one format: set data.format"):
        DataConfig(columns={"prompt": "question"})
    with pytest.raises(ValidationError, match=r"tags\n.*unknown name 'speaker_tag'; the names are LLaMA-Factory's"):
        DataConfig(format="sharegpt", tags={"speaker_tag": "x"})


def write_catalog(folder: Path) -> Path:
    """A dataset_info.json with several entries, its files beside it and below it."""
    (folder / "sub").mkdir(parents=True)
    write_json(folder / "qa.json", [RENAMED_ALPACA] * 5)
    write_jsonl(folder / "sub" / "chat.jsonl", [RENAMED_CHAT] * 4)
    (folder / "corpus.jsonl.gz").write_bytes(gzip.compress(b'{"body": "Once upon a time."}\n' * 3))
    catalog = folder / "dataset_info.json"
    catalog.write_text(
        json.dumps(
            {
                "qa": {"file_name": "qa.json", "columns": ALPACA_COLUMNS},
                "qa_few": {"file_name": "qa.json", "columns": ALPACA_COLUMNS, "num_samples": 2},
                "chat": {
                    "file_name": "sub/chat.jsonl",
                    "formatting": "sharegpt",
                    "columns": {"messages": "dialog"},
                    "tags": CHAT_TAGS,
                },
                "corpus": {"file_name": "corpus.jsonl.gz", "columns": {"prompt": "body"}},
                "hub_only": {"hf_hub_url": "someone/some-data"},
                "held_out": {"file_name": "qa.json", "split": "test"},
                "pairs": {"file_name": "qa.json", "ranking": True},
            }
        )
    )
    return catalog


def test_dataset_info_entries_give_file_format_mapping_and_cap(tmp_path) -> None:
    catalog = write_catalog(tmp_path / "lf")
    streams = {name: resolve(DataConfig(source=f"{catalog}#{name}"))[0] for name in ("qa", "qa_few", "chat", "corpus")}
    assert {n: (s.source, s.mapping.format, s.max_records) for n, s in streams.items()} == {
        "qa": (str(tmp_path / "lf" / "qa.json"), "alpaca", None),
        "qa_few": (str(tmp_path / "lf" / "qa.json"), "alpaca", 2),
        "chat": (str(tmp_path / "lf" / "sub" / "chat.jsonl"), "sharegpt", None),
        "corpus": (str(tmp_path / "lf" / "corpus.jsonl.gz"), "text", None),  # LLaMA-Factory's pre-training form
    }
    assert read(f"{catalog}#chat", DataConfig()) == [EXPECTED] * 4
    assert read(f"{catalog}#corpus", DataConfig()) == [{"text": "Once upon a time."}] * 3
    errors = {
        "hub_only": "the entry names a hub dataset (hf_hub_url: someone/some-data), which Tandem does not download; "
        "download its files and give them as data.source, or add a file_name",
        "held_out": "split 'test'; a data file holds one split, 'train', as LLaMA-Factory reads it: give held-out "
        "data as data.eval_source",
        "missing": "no entry 'missing' in the file; its entries: chat, corpus, held_out, hub_only, pairs, qa, qa_few",
    }
    for name, error in errors.items():
        with pytest.raises(UserError) as info:
            resolve(DataConfig(source=f"{catalog}#{name}"))
        assert str(info.value) == f"data.source: {catalog}#{name}: {error}"
    # The loader makes the json's path absolute and keeps the entry's name.
    relative = Path("lf") / "dataset_info.json"
    cfg = load_config(None, [f"data.source={tmp_path / relative}#qa"])
    assert cfg.data.source == f"{catalog}#qa"


def test_interleave_takes_records_by_weight_until_the_first_source_runs_out() -> None:
    def items(name: str, n: int, bad_at: int = -1):
        for i in range(n):
            yield (i != bad_at), f"{name}{i}"

    mixed = [item for valid, item in interleave([items("a", 4), items("b", 10, bad_at=1)], [2.0, 1.0])]
    # a:b = 2:1, spread evenly; b's invalid item passes through as it is met; a runs out after its 4th: stop.
    assert mixed == ["a0", "b0", "a1", "a2", "b1", "b2", "a3"]
    assert [item for _, item in capped(items("c", 10, bad_at=0), 2)] == ["c0", "c1", "c2"]  # caps count valid ones


def stage(data: DataConfig, storage: Path, model: str, messages: list[str] | None = None):
    return stage_dataset(
        data,
        Location(str(storage)),
        model,
        progress=(messages.append if messages is not None else lambda _: None),
        bars=False,
    )


def test_several_sources_are_mixed_and_counted_each(tmp_path, tiny_model) -> None:
    chats = write_jsonl(tmp_path / "chats.jsonl", arithmetic(30))
    catalog = write_catalog(tmp_path / "lf")
    qa = write_jsonl(tmp_path / "qa.jsonl", [{**RENAMED_ALPACA, "question": f"Add {i}"} for i in range(30)])
    sources = [
        {"source": chats, "weight": 2},
        {"source": qa, "format": "alpaca", "columns": ALPACA_COLUMNS},
        {"source": f"{catalog}#qa_few"},
    ]
    data = DataConfig(sources=sources, max_length=96, eval_ratio=0.2)
    messages: list[str] = []
    concat = stage(data, tmp_path / "s", tiny_model, messages)
    manifest, _ = read_manifest(Location(concat.url), "tandem.dataset/1")
    mix = manifest["mix"]
    assert mix["strategy"] == "concat"
    assert [(s["key"], s["format"], s["records"], s["weight"]) for s in mix["sources"]] == [
        ("data.sources[0]", "auto", 30, 2.0),
        ("data.sources[1]", "alpaca", 30, 1.0),
        ("data.sources[2]", "alpaca", 2, 1.0),
    ]  # num_samples: 2 of the entry's 5
    assert mix["sources"][2]["entry"] == f"{catalog}#qa_few" and manifest["records"]["read"] == 62
    assert [s["format"] for s in manifest["sources"]] == ["qwen", "alpaca", "alpaca"]
    assert f"data.sources[2] ({catalog}#qa_few): 2 records, at most 2" in messages

    messages.clear()
    interleaved = stage(data.model_copy(update={"mix": "interleave"}), tmp_path / "s", tiny_model, messages)
    manifest, _ = read_manifest(Location(interleaved.url), "tandem.dataset/1")
    # Weights 2:1:1, in turns a b c a | a b c a | a b c(none left): the third source (2 records) runs out first.
    assert [s["records"] for s in manifest["mix"]["sources"]] == [5, 3, 2] and manifest["records"]["read"] == 10
    assert interleaved.dataset_id != concat.dataset_id
    assert f"data.sources[0] ({chats}): 5 records, weight 2" in messages
    again = stage(data.model_copy(update={"mix": "interleave"}), tmp_path / "again", tiny_model)
    assert again.dataset_id == interleaved.dataset_id  # deterministic
    from flows.prepare import summary_rows  # the CLI's summary: one row per source

    assert [value for name, value in summary_rows(interleaved, Location(str(tmp_path / "s"))) if name == "source"] == [
        f"data.sources[0] ({chats}): 5 records, 0 rejected",
        f"data.sources[1] ({qa}): 3 records, 0 rejected",
        f"data.sources[2] ({catalog}#qa_few): 2 records, 0 rejected",
    ]
