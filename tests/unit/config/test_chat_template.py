"""The built-in models' chat template renders byte for byte what Qwen2.5-Instruct's published template renders.

Expected strings are written from Qwen's documented format (Qwen's function-calling guide: the system turn with
the default system message, the `# Tools` block listing one JSON schema per line, `<tool_call>` blocks in the
assistant turn, `<tool_response>` blocks of consecutive results in one user turn), never produced by the template
under test. Both built-in tokenizers carry the template, and the export writes the one the run used.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from config.chat_template import builtin_template, resolve_chat_template
from core.errors import UserError
from staging.tokenizer import load_tokenizer

DEFAULT_SYSTEM = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
CURRENT = {
    "type": "function",
    "function": {
        "name": "get_current_temperature",
        "description": "Get current temperature at a location.",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]},
    },
}
DATED = {
    "type": "function",
    "function": {
        "name": "get_temperature_date",
        "description": "Get temperature at a location and date.",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string"}, "date": {"type": "string"}},
            "required": ["location", "date"],
        },
    },
}
QUESTION = {"role": "user", "content": "What's the temperature in San Francisco now? How about tomorrow?"}


def tools_system(system: str, tools: list[dict]) -> str:
    """Qwen2.5's system turn with tools, as its documentation shows it."""
    listed = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
    return (
        f"<|im_start|>system\n{system}\n\n# Tools\n\nYou may call one or more functions to assist with the user "
        "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"
        f"{listed}\n</tools>\n\nFor each function call, return a json object with function name and arguments "
        'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
        "<args-json-object>}\n</tool_call><|im_end|>\n"
    )


def call(name: str, arguments: dict) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


SF = {"location": "San Francisco, CA, USA"}
SF_TOMORROW = {"location": "San Francisco, CA, USA", "date": "2024-10-01"}
RESULT_NOW = '{"temperature": 26.1, "location": "San Francisco, CA, USA", "unit": "celsius"}'
RESULT_TOMORROW = '{"temperature": 25.9, "location": "San Francisco, CA, USA", "date": "2024-10-01", "unit": "celsius"}'

# (case, messages, tools, add_generation_prompt, expected): every case of Qwen2.5's format.
CASES = [
    (
        "no system message: Qwen's default one",
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
        None,
        False,
        DEFAULT_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n",
    ),
    (
        "own system message",
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
        ],
        None,
        False,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!"
        "<|im_end|>\n",
    ),
    (
        "generation prompt",
        [{"role": "user", "content": "Hi"}],
        None,
        True,
        DEFAULT_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        "multi-turn, multi-byte text",
        [
            {"role": "user", "content": "你好"},
            {"role": "assistant", "content": "你好！"},  # noqa: RUF001 - the full-width mark of Chinese text
            {"role": "user", "content": "Ünïcödé 🙂"},
            {"role": "assistant", "content": "ok"},
        ],
        None,
        False,
        DEFAULT_SYSTEM + "<|im_start|>user\n你好<|im_end|>\n<|im_start|>assistant\n你好！<|im_end|>\n"  # noqa: RUF001 - the full-width mark of Chinese text
        "<|im_start|>user\nÜnïcödé 🙂<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n",
    ),
    (
        "tools, no call",
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
        [CURRENT],
        False,
        tools_system("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", [CURRENT])
        + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n",
    ),
    (
        "tools with an own system message",
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        [CURRENT, DATED],
        True,
        tools_system("Be brief.", [CURRENT, DATED]) + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        "one call and its result",
        [
            QUESTION,
            {"role": "assistant", "content": "", "tool_calls": [call("get_current_temperature", SF)]},
            {"role": "tool", "content": RESULT_NOW},
            {"role": "assistant", "content": "It is 26.1°C."},
        ],
        [CURRENT],
        False,
        tools_system("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", [CURRENT])
        + f"<|im_start|>user\n{QUESTION['content']}<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_current_temperature", "arguments": {"location": "San Francisco, CA, USA"}}\n</tool_call>'
        f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{RESULT_NOW}\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nIt is 26.1°C.<|im_end|>\n",
    ),
    (
        "several calls in one turn, several consecutive results, then the generation prompt",
        [
            QUESTION,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [call("get_current_temperature", SF), call("get_temperature_date", SF_TOMORROW)],
            },
            {"role": "tool", "content": RESULT_NOW},
            {"role": "tool", "content": RESULT_TOMORROW},
        ],
        [CURRENT, DATED],
        True,
        tools_system("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", [CURRENT, DATED])
        + f"<|im_start|>user\n{QUESTION['content']}<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_current_temperature", "arguments": {"location": "San Francisco, CA, USA"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_temperature_date", "arguments": {"location": "San Francisco, CA, USA", "date": '
        '"2024-10-01"}}\n</tool_call><|im_end|>\n'
        f"<|im_start|>user\n<tool_response>\n{RESULT_NOW}\n</tool_response>\n<tool_response>\n{RESULT_TOMORROW}\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        "text before a call",
        [
            QUESTION,
            {"role": "assistant", "content": "Let me check.", "tool_calls": [call("get_current_temperature", SF)]},
        ],
        [CURRENT],
        False,
        tools_system("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", [CURRENT])
        + f"<|im_start|>user\n{QUESTION['content']}<|im_end|>\n<|im_start|>assistant\nLet me check.\n<tool_call>\n"
        '{"name": "get_current_temperature", "arguments": {"location": "San Francisco, CA, USA"}}\n</tool_call>'
        "<|im_end|>\n",
    ),
]


@pytest.mark.parametrize(("case", "messages", "tools", "generation", "expected"), CASES, ids=[c[0] for c in CASES])
def test_the_builtin_template_renders_qwen25_byte_for_byte(
    builtin_tokenizer, case, messages, tools, generation, expected
) -> None:
    tokenizer = load_tokenizer(builtin_tokenizer)
    assert (
        tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=generation)
        == expected
    )


def test_builtin_models_carry_the_template_and_its_tokens_as_single_tokens(builtin_tokenizer) -> None:
    assert (Path(builtin_tokenizer) / "chat_template.jinja").read_text() == builtin_template("qwen2.5")
    tokenizer = load_tokenizer(builtin_tokenizer)
    for marker in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>"):
        assert len(tokenizer(marker, add_special_tokens=False)["input_ids"]) == 1, marker
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


def test_tiny_qwen25_has_qwens_ids_and_no_qwen3_tokens(qwen25_tokenizer) -> None:
    tokenizer = load_tokenizer(qwen25_tokenizer)
    assert len(tokenizer) == 151665
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>"]) == [
        151643,
        151644,
        151645,
        151657,
    ]
    assert len(tokenizer("<tool_response>", add_special_tokens=False)["input_ids"]) > 1  # Qwen3 added it


def test_the_export_writes_the_template_the_run_used(tiny_model, tmp_path) -> None:
    from trainer.checkpointing.export import save_tokenizer

    own = "{% for m in messages %}{{ m.content }}{% endfor %}"
    save_tokenizer(tiny_model, str(tmp_path / "own"), own)
    save_tokenizer(tiny_model, str(tmp_path / "base"), None)
    assert (tmp_path / "own" / "chat_template.jinja").read_text() == own
    assert (tmp_path / "base" / "chat_template.jinja").read_text() == builtin_template("qwen2.5")


def test_model_chat_template_is_a_builtin_name_or_a_file(tmp_path) -> None:
    assert resolve_chat_template(None) is None
    assert resolve_chat_template("qwen2.5") == builtin_template("qwen2.5")
    (tmp_path / "t.jinja").write_text("{{ messages }}")
    assert resolve_chat_template(str(tmp_path / "t.jinja")) == "{{ messages }}"
    with pytest.raises(UserError, match=r"^model.chat_template: nope is neither a built-in template \(qwen2.5\) nor"):
        resolve_chat_template("nope")
