"""Reading data: every format to one chat form, `auto` per file, JSON/JSONL/Parquet with exact locations,
and every kind of invalid record named with its location and reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from config.loader import load_config
from core.errors import UserError
from staging.sources import expand
from storage.location import Location
from tests.datafiles import openai, qwen, read_records, write_json, write_jsonl, write_parquet

# One conversation (system, two exchanges) written in each of the four formats.
SAME_CONVERSATION = {
    "qwen": qwen(
        ("system", "Be brief."),
        ("user", "Add 2 and 3."),
        ("assistant", "5."),
        ("user", "Times 4?"),
        ("assistant", "20."),
    ),
    "sharegpt": {
        "system": "Be brief.",
        "conversations": [
            {"from": "human", "value": "Add 2 and 3."},
            {"from": "gpt", "value": "5."},
            {"from": "human", "value": "Times 4?"},
            {"from": "gpt", "value": "20."},
        ],
    },
    "openai": openai(
        ("system", "Be brief."),
        ("user", "Add 2 and 3."),
        ("assistant", "5."),
        ("user", "Times 4?"),
        ("assistant", "20."),
    ),
    "alpaca": {
        "instruction": "Times 4?",
        "input": "",
        "output": "20.",
        "system": "Be brief.",
        "history": [["Add 2 and 3.", "5."]],
    },
}
EXPECTED = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": "5."},
        {"role": "user", "content": "Times 4?"},
        {"role": "assistant", "content": "20."},
    ]
}
WRITERS = {"jsonl": write_jsonl, "json": write_json, "parquet": write_parquet}


@pytest.mark.parametrize("fmt", sorted(SAME_CONVERSATION))
@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_every_format_and_file_kind_gives_the_same_conversation(tmp_path, fmt, kind) -> None:
    path = WRITERS[kind](tmp_path / f"d.{kind}", [SAME_CONVERSATION[fmt]] * 2)
    for requested in ("auto", fmt):
        records = read_records(path, requested)
        assert [r.conversation for r in records] == [EXPECTED, EXPECTED]
    where = {"jsonl": f"{path}:2", "json": f"{path}[1]", "parquet": f"{path}#1"}[kind]
    assert records[1].location == where


def test_sharegpt_tools_function_calls_and_observations(tmp_path) -> None:
    tools = [{"name": "add", "description": "Add two numbers", "parameters": {"type": "object"}}]
    record = {
        "tools": json.dumps(tools),
        "conversations": [
            {"from": "human", "value": "Add 2 and 3."},
            {"from": "function_call", "value": json.dumps({"name": "add", "arguments": {"a": 2, "b": 3}})},
            {"from": "observation", "value": "5"},
            {"from": "gpt", "value": "It is 5."},
        ],
    }
    [got] = read_records(write_jsonl(tmp_path / "d.jsonl", [record]), "auto")
    assert got.conversation == {
        "tools": tools,
        "messages": [
            {"role": "user", "content": "Add 2 and 3."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
            },
            {"role": "tool", "content": "5"},
            {"role": "assistant", "content": "It is 5."},
        ],
    }


def test_openai_content_may_be_text_parts(tmp_path) -> None:
    record = openai(
        ("user", [{"type": "text", "text": "Add 2"}, {"type": "text", "text": "and 3."}]), ("assistant", "5.")
    )
    [got] = read_records(write_jsonl(tmp_path / "d.jsonl", [record]), "auto")
    assert got.conversation["messages"][0] == {"role": "user", "content": "Add 2\nand 3."}


def test_llamafactory_v1_parts_and_loss_weight_are_the_openai_form(tmp_path) -> None:
    def parts(*items: tuple[str, str]) -> list[dict[str, str]]:
        return [{"type": kind, "value": value} for kind, value in items]

    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    v1 = {
        "messages": [
            {
                "role": "system",
                "content": parts(("text", "Be brief."), ("tools", json.dumps(tools))),
                "loss_weight": 0.0,
            },
            {"role": "user", "content": parts(("text", "Add 2"), ("text", "and 3.")), "loss_weight": 0.0},
            {
                "role": "assistant",
                "content": parts(("tool_call", json.dumps({"name": "add", "arguments": {"a": 2}}))),
                "loss_weight": 0.0,
            },
            {"role": "tool", "content": parts(("text", "5"))},
            {
                "role": "assistant",
                "content": parts(("reasoning", "2 + 3 = 5."), ("text", "It is 5.")),
                "loss_weight": 1.0,
            },
        ]
    }
    [got] = read_records(write_jsonl(tmp_path / "d.jsonl", [v1]), "auto")
    assert got.conversation == {
        "tools": tools,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Add 2\nand 3."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2}}}],
                "weight": 0,
            },
            {"role": "tool", "content": "5"},
            {"role": "assistant", "content": "It is 5.", "reasoning_content": "2 + 3 = 5."},
        ],
    }


def test_openai_weight_zero_turns_are_kept_but_marked(tmp_path) -> None:
    record = {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hey", "weight": 0},
            {"role": "user", "content": "Add 1 and 1"},
            {"role": "assistant", "content": "2"},
        ]
    }
    [got] = read_records(write_jsonl(tmp_path / "d.jsonl", [record]), "openai")
    assert got.conversation["messages"][1] == {"role": "assistant", "content": "Hey", "weight": 0}
    assert "weight" not in got.conversation["messages"][3]


def test_alpaca_joins_instruction_and_input(tmp_path) -> None:
    record = {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"}
    [got] = read_records(write_json(tmp_path / "d.json", [record]), "auto")
    assert got.conversation == {
        "messages": [{"role": "user", "content": "Add the numbers.\n2 and 3"}, {"role": "assistant", "content": "5"}]
    }


def test_text_records_are_plain_text(tmp_path) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl", [{"text": "Once upon a time.", "meta": {"source": "web"}}, {"text": "  "}, {"text": 3}]
    )
    records = read_records(write_jsonl(tmp_path / "ok.jsonl", [{"text": "Once upon a time."}]), "auto")
    assert [r.conversation for r in records] == [{"text": "Once upon a time."}]
    with pytest.raises(UserError, match=rf"^{path}:2: text: empty text "):
        read_records(path, "text")
    from staging.formats import InvalidRecord, normalize_text

    with pytest.raises(InvalidRecord, match=r"^text: expected a string, got int$"):
        normalize_text({"text": 3})


def test_auto_decides_per_file_in_a_directory_and_a_glob(tmp_path) -> None:
    for fmt, kind in zip(sorted(SAME_CONVERSATION), ("json", "jsonl", "parquet", "jsonl"), strict=True):
        WRITERS[kind](tmp_path / f"{fmt}.{kind}", [SAME_CONVERSATION[fmt]])
    (tmp_path / "README.md").write_text("not data")
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / "zz-empty.jsonl").write_text("")  # an empty file holds no records: nothing to reject
    records = read_records(str(tmp_path), "auto")
    assert [r.conversation for r in records] == [EXPECTED] * 4
    assert [Path(r.location.split("#")[0].split(":")[0].split("[")[0]).name for r in records] == [
        "alpaca.json",
        "openai.jsonl",
        "qwen.parquet",
        "sharegpt.jsonl",
    ]
    assert len(read_records(str(tmp_path / "*.jsonl"), "auto")) == 2


def test_auto_explains_when_it_cannot_tell(tmp_path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}])
    with pytest.raises(UserError) as info:
        read_records(path, "auto")
    assert str(info.value) == (
        f"cannot tell the format of {path}: records have keys ['completion', 'prompt']; "
        "pass --format qwen|sharegpt|openai|alpaca|text (data.format)"
    )
    garbage = tmp_path / "g.jsonl"
    garbage.write_text("{oops\n")
    with pytest.raises(UserError, match=r"^cannot tell the format of .*g.jsonl: its first records are not valid JSON"):
        read_records(str(garbage), "auto")
    mixed = write_jsonl(tmp_path / "m.jsonl", [SAME_CONVERSATION["qwen"], SAME_CONVERSATION["alpaca"]])
    with pytest.raises(UserError, match=r"its first records look like \['alpaca', 'qwen'\]; pass --format"):
        read_records(mixed, "auto")


GOOD = qwen(("user", "hi"), ("assistant", "hello"))


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (qwen(("user", "hi")), "no assistant turn"),
        (
            qwen(("system", "s"), ("assistant", "hi"), ("user", "x"), ("assistant", "y")),
            "roles out of order: turn 1 is 'assistant', expected 'user' or 'tool'",
        ),
        (
            qwen(("user", "hi"), ("user", "again"), ("assistant", "x")),
            "roles out of order: turn 1 is 'user', expected 'assistant'",
        ),
        (
            qwen(("user", "hi"), ("assistant", "x"), ("user", "more")),
            "the last turn is 'user'; a conversation must end with the assistant",
        ),
        (qwen(("user", "hi"), ("assistant", "  ")), "conversations[1].value: empty text"),
        (
            qwen(("user", "hi"), ("robot", "x")),
            "conversations[1]: 'from' must be one of ['assistant', 'system', 'user'], got 'robot'",
        ),
        (
            {"conversations": [{"from": "user", "value": 3}, {"from": "assistant", "value": "x"}]},
            "conversations[0].value: expected a string, got int",
        ),
        ({"conversations": "hi"}, "'conversations' must be a list of turns, got str"),
        ([1, 2], "expected an object with 'conversations', got list"),
    ],
)
def test_invalid_qwen_records_name_line_and_reason(tmp_path, record, reason) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD, GOOD, record])
    with pytest.raises(UserError) as info:
        read_records(path, "qwen")
    assert str(info.value) == f"{path}:3: {reason} (or set data.on_invalid=skip to skip invalid records)"


@pytest.mark.parametrize(
    ("fmt", "record", "reason"),
    [
        (
            "openai",
            openai(("user", "hi"), ("assistant", [{"type": "input_audio", "input_audio": {}}])),
            "messages[1].content[0]: only text, reasoning, tool_call and tools parts (and image, image_url) are "
            "supported, got 'input_audio'",
        ),
        (
            "openai",
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "x", "loss_weight": 0.5},
                ]
            },
            "messages[1].loss_weight: must be 0 or 1 (a turn is a target or not), got 0.5",
        ),
        (
            "openai",
            {
                "messages": [
                    {"role": "user", "content": "hi", "loss_weight": 1.0},
                    {"role": "assistant", "content": "x"},
                ]
            },
            "messages[0].loss_weight: only assistant turns can be targets, got 1.0 on a 'user' turn",
        ),
        ("openai", openai(("user", "hi"), ("bot", "x")), "messages[1]: 'role' must be one of"),
        ("openai", openai(("user", "hi"), ("assistant", None)), "messages[1].content: expected a string, got null"),
        (
            "openai",
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", "weight": 2}]},
            "messages[1].weight: must be 0 or 1",
        ),
        (
            "sharegpt",
            {
                "conversations": [
                    {"from": "human", "value": "hi"},
                    {"from": "observation", "value": "5"},
                    {"from": "gpt", "value": "x"},
                ]
            },
            "roles out of order: turn 1 is 'tool', expected 'assistant'",
        ),
        (
            "sharegpt",
            {"conversations": [{"from": "human", "value": "hi"}, {"from": "function_call", "value": "{not json"}]},
            "conversations[1]: a function_call must be JSON with 'name' and 'arguments'",
        ),
        (
            "sharegpt",
            {"tools": "[1]", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "x"}]},
            "tools[0]: expected a function schema (an object), got int",
        ),
        ("alpaca", {"instruction": "", "input": "", "output": "x"}, "instruction: empty text (and no input)"),
        ("alpaca", {"instruction": "Do it", "output": 5}, "output: expected a string, got int"),
        (
            "alpaca",
            {"instruction": "Do it", "output": "x", "history": [["only one"]]},
            "history[0]: expected a [query, response] pair, got list",
        ),
    ],
)
def test_invalid_records_of_other_formats(tmp_path, fmt, record, reason) -> None:
    path = write_json(tmp_path / "d.json", [record])
    with pytest.raises(UserError) as info:
        read_records(path, fmt)
    assert str(info.value).startswith(f"{path}[0]: {reason}")


def test_a_json_array_is_read_one_record_at_a_time(tmp_path, monkeypatch) -> None:
    """LLaMA-Factory's sets are JSON arrays of up to millions of records: parsed as the file streams in, never whole."""
    from staging import sources

    monkeypatch.setattr(sources, "BLOCK", 4096)
    path = write_json(tmp_path / "big.json", [qwen(("user", f"q{i} " * 10), ("assistant", "a")) for i in range(2000)])
    read: list[int] = []
    items = sources.read_file(Location(path), read.append)
    assert next(items)[0] == f"{path}[0]" and sum(read) <= 2 * 4096 < Path(path).stat().st_size / 20
    assert [location for location, _ in items][-1] == f"{path}[1999]" and sum(read) == Path(path).stat().st_size


def test_malformed_json_names_the_line_or_the_file(tmp_path) -> None:
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text(json.dumps(GOOD) + "\n\n{not json\n")
    with pytest.raises(UserError, match=rf"^{jsonl}:3: malformed JSON \(.*column 2\)"):
        read_records(str(jsonl), "auto")
    array = tmp_path / "d.json"
    array.write_text('[\n {"conversations": []},\n {oops}\n]')
    with pytest.raises(UserError, match=rf"^{array}:3: malformed JSON .*; fix the file$"):
        read_records(str(array), "auto")
    single = tmp_path / "one.json"
    single.write_text(json.dumps({"data": [GOOD]}, indent=1))
    with pytest.raises(UserError) as info:
        read_records(str(single), "auto")
    assert (
        str(info.value)
        == f"{single}: expected a JSON array of records or JSON Lines, got one JSON dict over several lines"
    )


def test_parquet_rows_are_located_by_row(tmp_path) -> None:
    records = [{"instruction": "Add 1 and 1", "output": "2"}, {"instruction": "Add 2 and 2", "output": ""}]
    path = write_parquet(tmp_path / "d.parquet", records)
    with pytest.raises(UserError, match=rf"^{path}#1: output: empty text"):
        read_records(path, "auto")


def test_sources_expand_to_data_files_or_fail_naming_the_key(tmp_path) -> None:
    (tmp_path / "sub").mkdir()
    write_jsonl(tmp_path / "sub" / "b.jsonl", [GOOD])
    write_json(tmp_path / "a.json", [GOOD])
    (tmp_path / ".hidden.jsonl").write_text("")
    assert [str(url) for url in expand(Location(str(tmp_path)), "data.source")] == [
        str(tmp_path / "a.json"),
        str(tmp_path / "sub" / "b.jsonl"),
    ]
    with pytest.raises(UserError, match=r"^data.eval_source: .*\*.parquet matches no file; check the pattern$"):
        expand(Location(str(tmp_path / "*.parquet")), "data.eval_source")
    with pytest.raises(UserError, match=r"^data.source: .*missing.jsonl does not exist"):
        expand(Location(str(tmp_path / "missing.jsonl")), "data.source")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"^data.source: directory .*empty holds no .jsonl/.ndjson/.json"):
        expand(Location(str(tmp_path / "empty")), "data.source")


def test_config_accepts_directories_and_globs_and_names_the_key_when_missing(tmp_path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [GOOD])
    for source in (str(tmp_path), str(tmp_path / "*.jsonl"), "s3://bucket/data/*.jsonl"):
        assert load_config(None, [f"data.source={source}"]).data.source == source
    for source, message in (
        (str(tmp_path / "*.parquet"), "matches no file"),
        (str(tmp_path / "nope"), "does not exist"),
    ):
        with pytest.raises(UserError, match=rf"^data.source: .* {message}"):
            load_config(None, [f"data.source={source}"])
    with pytest.raises(UserError, match=r"^data.eval_source: "):
        load_config(None, [f"data.eval_source={tmp_path / 'missing.json'}"])


def test_tool_call_arguments_become_objects_and_bad_ones_are_named() -> None:
    from staging.formats import InvalidRecord, normalize_openai

    def record(arguments: object) -> dict:
        return {
            "messages": [
                {"role": "user", "content": "Add"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": arguments}}],
                },
                {"role": "tool", "content": "5"},
                {"role": "assistant", "content": "5", "reasoning_content": "easy"},
            ]
        }

    messages = normalize_openai(record('{"a": 2}'))["messages"]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"a": 2}
    assert messages[3]["reasoning_content"] == "easy"
    with pytest.raises(InvalidRecord, match=r"^messages\[1\]\.tool_calls\[0\]\.function\.arguments: not valid JSON "):
        normalize_openai(record("{a: 2"))
    with pytest.raises(
        InvalidRecord,
        match=r"^messages\[1\]\.tool_calls\[0\]\.function\.arguments: expected an "
        r"object, got list",
    ):
        normalize_openai(record([1]))


def test_a_txt_file_is_plain_text_one_example_a_line(tmp_path) -> None:
    import gzip

    content = b"\xef\xbb\xbfFirst line.\r\n\n   \nSecond line.\nThird, without a newline"
    plain = tmp_path / "wiki.txt"
    plain.write_bytes(content)
    (tmp_path / "wiki.txt.gz").write_bytes(gzip.compress(content))
    for path in (plain, tmp_path / "wiki.txt.gz"):
        records = read_records(str(path), "auto")  # no --format needed
        assert [r.conversation for r in records] == [
            {"text": "First line."},
            {"text": "Second line."},
            {"text": "Third, without a newline"},
        ]  # the BOM, the line ends and the blank lines are no part of any example
        assert [r.location for r in records] == [f"{path}:1", f"{path}:4", f"{path}:5"]
        assert [r.conversation for r in read_records(str(path), "text")] == [r.conversation for r in records]
    with pytest.raises(UserError) as info:
        read_records(str(plain), "sharegpt")
    assert (
        str(info.value)
        == f"{plain}: a .txt file is plain text, one example a line, not sharegpt; read it as auto or text"
    )
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n\xff\xfe not utf-8\n")
    with pytest.raises(UserError) as info:
        read_records(str(bad), "auto")
    assert str(info.value) == (
        f"{bad}:2: not UTF-8 text (byte 1 of the line) (or set data.on_invalid=skip to skip invalid records)"
    )


def test_a_directory_is_read_as_its_txt_files_only_when_it_holds_no_json_data(tmp_path) -> None:
    import zstandard

    texts, mixed = tmp_path / "texts", tmp_path / "mixed"
    texts.mkdir()
    mixed.mkdir()
    (texts / "a.txt").write_text("one\n")
    (texts / "b.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(b"two\n"))
    write_jsonl(mixed / "chat.jsonl", [GOOD])
    (mixed / "README.txt").write_text("How this data was made.\n")  # documentation beside the data, not data
    assert [str(url) for url in expand(Location(str(texts)), "data.source")] == [
        str(texts / "a.txt"),
        str(texts / "b.txt.zst"),
    ]
    assert [str(url) for url in expand(Location(str(mixed)), "data.source")] == [str(mixed / "chat.jsonl")]
    assert [r.conversation for r in read_records(str(texts), "auto")] == [{"text": "one"}, {"text": "two"}]
