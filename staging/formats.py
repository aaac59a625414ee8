"""The record formats Tandem reads, each normalized to one chat form (or plain text), and `auto` detection per file.

The internal form is what the chat template receives: `{"messages": [{"role", "content", ...}], "tools": [...]}`
with roles `system` (first only), `user`, `assistant` (optionally with OpenAI-style `tool_calls` and a
`reasoning_content` string) and `tool`. Plain text (format `text`, continued pre-training or completion data)
is `{"text": ...}`: no template, every token a target. Tool-call arguments are objects: a JSON string of one
(OpenAI's form) is parsed, as serving systems do before rendering, so the template writes the same JSON either way.
A record that cannot be used raises `InvalidRecord` with the reason; the caller adds the location.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Message = dict[str, Any]
Conversation = dict[str, Any]
FORMATS = ("qwen", "sharegpt", "openai", "alpaca", "text")
QWEN_ROLES = {"system": "system", "user": "user", "assistant": "assistant"}
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "gpt": "assistant",
    "function_call": "assistant",
    "observation": "tool",
}
OPENAI_ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ONLY = {"human", "gpt", "function_call", "observation"}
PART_TYPES = ("text", "reasoning", "tool_call", "tools")  # content parts Tandem reads (image parts: staging/images.py)
DETECT_SAMPLE = 16  # records looked at per file by `auto`


class InvalidRecord(Exception):
    """A record that cannot be used; str() is the reason, without the location."""


def type_name(value: object) -> str:
    """What a JSON value is, for messages: `null`, `str`, `list`, ..."""
    return "null" if value is None else type(value).__name__


def require_text(value: object, where: str, *, allow_empty: bool = False) -> str:
    """A non-empty string, or InvalidRecord naming `where`."""
    if not isinstance(value, str):
        raise InvalidRecord(f"{where}: expected a string, got {type_name(value)}")
    if not allow_empty and not value.strip():
        raise InvalidRecord(f"{where}: empty text")
    return value


def _object(record: object, key: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise InvalidRecord(f"expected an object with {key!r}, got {type_name(record)}")
    return record


def _list_field(record: dict[str, Any], key: str) -> list[Any]:
    value = record.get(key)
    if not isinstance(value, list):
        got = "nothing" if key not in record else type_name(value)
        raise InvalidRecord(f"{key!r} must be a list of turns, got {got}")
    return value


def optional_text(record: dict[str, Any], key: str) -> str | None:
    """An optional string field: absent, null or blank count as not given."""
    value = record.get(key)
    if value is None:
        return None
    text = require_text(value, key, allow_empty=True)
    return text if text.strip() else None


def check_order(messages: list[Message]) -> None:
    """System first (optional), then a user turn or tool results and the assistant alternating, ending with the
    assistant; at least one assistant turn."""
    roles = [m["role"] for m in messages]
    if "assistant" not in roles:
        raise InvalidRecord("no assistant turn")
    start = 1 if roles[0] == "system" else 0
    previous = None
    for index in range(start, len(messages)):
        role = roles[index]
        allowed: tuple[str, ...]
        if previous in (None, "assistant"):
            # LLaMA-Factory's rule: an observation may stand wherever a user turn may, so a tool result may follow
            # an answer that made no call (the template renders it as a tool result all the same).
            allowed = ("user", "tool")
        elif previous == "user":
            allowed = ("assistant",)
        else:  # a tool result: more results, or the assistant's answer
            allowed = ("tool", "assistant")
        if role not in allowed:
            expected = " or ".join(repr(r) for r in allowed)
            raise InvalidRecord(f"roles out of order: turn {index} is {role!r}, expected {expected}")
        previous = role
    if roles[-1] != "assistant":
        raise InvalidRecord(f"the last turn is {roles[-1]!r}; a conversation must end with the assistant")


def _arguments(value: object, where: str) -> dict[str, Any]:
    """A tool call's arguments as an object (a JSON string of one is parsed)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as exc:
            raise InvalidRecord(f"{where}.arguments: not valid JSON ({exc.msg}); give an object or its JSON") from None
    if not isinstance(value, dict):
        raise InvalidRecord(f"{where}.arguments: expected an object, got {type_name(value)}")
    return value


def _call(name: object, arguments: object, where: str) -> dict[str, Any]:
    if not isinstance(name, str) or not name.strip():
        raise InvalidRecord(f"{where}: a tool call needs a 'name' string, got {type_name(name)}")
    return {"type": "function", "function": {"name": name, "arguments": _arguments(arguments, where)}}


def _tool_calls(value: object, where: str) -> list[dict[str, Any]]:
    """OpenAI-style tool calls from a ShareGPT function_call value: {"name", "arguments"} or a list of them."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise InvalidRecord(
                f"{where}: a function_call must be JSON with 'name' and 'arguments' ({exc.msg})"
            ) from None
    calls = value if isinstance(value, list) else [value]
    out = []
    for call in calls:
        if not isinstance(call, dict):
            raise InvalidRecord(f"{where}: a function_call needs a 'name' string, got {type_name(call)}")
        out.append(_call(call.get("name"), call.get("arguments", {}), where))
    return out


def _openai_tool_calls(value: object, where: str) -> list[dict[str, Any]]:
    """OpenAI `tool_calls` ([{"type": "function", "function": {"name", "arguments"}}]), arguments as objects."""
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        raise InvalidRecord(f"{where}: expected a list of objects, got {type_name(value)}")
    out = []
    for index, call in enumerate(value):
        function = call.get("function")
        if not isinstance(function, dict):
            raise InvalidRecord(
                f"{where}[{index}].function: expected an object with 'name' and 'arguments', got {type_name(function)}"
            )
        out.append(_call(function.get("name"), function.get("arguments", {}), f"{where}[{index}].function"))
    return out


def parse_tools(value: object) -> list[Any] | None:
    """A `tools` field: a list of function schemas, or a JSON string of one (LLaMA-Factory's ShareGPT)."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise InvalidRecord(f"tools: not valid JSON ({exc.msg})") from None
    if not isinstance(value, list):
        raise InvalidRecord(f"tools: expected a list of function schemas, got {type_name(value)}")
    for index, tool in enumerate(value):
        if not isinstance(tool, dict):
            raise InvalidRecord(f"tools[{index}]: expected a function schema (an object), got {type_name(tool)}")
    return value


def to_conversation(messages: list[Message], tools: list[Any] | None) -> Conversation:
    """The internal chat form of checked messages (check_order) and their tools."""
    check_order(messages)
    return {"messages": messages, "tools": tools} if tools else {"messages": messages}


def from_value_turn(turn: object, where: str, roles: dict[str, str]) -> Message:
    """One `{from, value}` turn (Qwen and ShareGPT) as a message."""
    if not isinstance(turn, dict):
        raise InvalidRecord(f"{where}: expected an object with 'from' and 'value', got {type_name(turn)}")
    tag = turn.get("from")
    role = roles.get(tag) if isinstance(tag, str) else None
    if role is None:
        raise InvalidRecord(f"{where}: 'from' must be one of {sorted(roles)}, got {turn.get('from')!r}")
    if turn["from"] == "function_call":
        return {"role": "assistant", "content": "", "tool_calls": _tool_calls(turn.get("value"), where)}
    return {"role": role, "content": require_text(turn.get("value"), f"{where}.value")}


def from_value_turns(record: object, roles: dict[str, str]) -> list[Message]:
    """`conversations: [{from, value}]` turns (Qwen and ShareGPT) as messages."""
    turns = _list_field(_object(record, "conversations"), "conversations")
    return [from_value_turn(turn, f"conversations[{index}]", roles) for index, turn in enumerate(turns)]


def sharegpt_messages(record: object, roles: dict[str, str]) -> tuple[list[Message], list[Any] | None]:
    """A ShareGPT record's turns, with its `system` column as the first turn, and its `tools`."""
    messages = from_value_turns(record, roles)
    assert isinstance(record, dict)  # checked by from_value_turns
    system = optional_text(record, "system")
    if system is not None and not (messages and messages[0]["role"] == "system"):
        messages.insert(0, {"role": "system", "content": system})
    return messages, parse_tools(record.get("tools"))


def normalize_qwen(record: object) -> Conversation:
    """Qwen's `conversations` with `from` in system|user|assistant."""
    return to_conversation(from_value_turns(record, QWEN_ROLES), None)


def normalize_sharegpt(record: object) -> Conversation:
    """ShareGPT `conversations` (human|gpt|system|function_call|observation), optional `system` and `tools`."""
    return to_conversation(*sharegpt_messages(record, SHAREGPT_ROLES))


def _part_text(part: dict[str, Any], where: str) -> str:
    """A part's string: OpenAI's parts hold it under `text`, LLaMA-Factory v1's under `value`."""
    key = "value" if "value" in part else "text"
    return require_text(part.get(key), f"{where}.{key}", allow_empty=True)


def _content(value: object, where: str, *, allow_empty: bool) -> tuple[str, Message]:
    """A message's text and what its parts add: a string, or a list of parts (OpenAI's text parts, or
    LLaMA-Factory v1's `{"type", "value"}` parts: text, reasoning, tool_call, tools)."""
    extra: Message = {}
    if value is None and allow_empty:
        return "", extra
    if isinstance(value, list):
        texts = []
        for index, part in enumerate(value):
            at = f"{where}[{index}]"
            kind = part.get("type") if isinstance(part, dict) else type_name(part)
            if kind not in PART_TYPES or not isinstance(part, dict):
                names = ", ".join(PART_TYPES[:-1]) + f" and {PART_TYPES[-1]}"
                raise InvalidRecord(f"{at}: only {names} parts (and image, image_url) are supported, got {kind!r}")
            if kind == "text":
                texts.append(_part_text(part, at))
            elif kind == "reasoning":
                extra["reasoning_content"] = extra.get("reasoning_content", "") + _part_text(part, at)
            elif kind == "tool_call":
                extra.setdefault("tool_calls", []).extend(_tool_calls(_part_text(part, at), at))
            else:
                extra["tools"] = _part_text(part, at)
        value = "\n".join(texts)
        allow_empty = allow_empty or "tool_calls" in extra
    return require_text(value, where, allow_empty=allow_empty), extra


def _loss_weight(turn: dict[str, Any], role: str, where: str) -> int | None:
    """0 when an assistant turn is not a target: OpenAI's `weight` (0 or 1) or LLaMA-Factory v1's `loss_weight`."""
    key = "loss_weight" if "loss_weight" in turn else "weight"
    value = turn.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or value not in (0, 1):
        raise InvalidRecord(f"{where}.{key}: must be 0 or 1 (a turn is a target or not), got {value!r}")
    if role != "assistant" and value:
        raise InvalidRecord(f"{where}.{key}: only assistant turns can be targets, got {value!r} on a {role!r} turn")
    return 0 if value == 0 and role == "assistant" else None


def openai_message(turn: object, where: str) -> tuple[Message, object]:
    """One OpenAI (or LLaMA-Factory v1) message, and the tools a `tools` part of it gives (None when none)."""
    if not isinstance(turn, dict):
        raise InvalidRecord(f"{where}: expected an object with 'role' and 'content', got {type_name(turn)}")
    role = turn.get("role")
    if role not in OPENAI_ROLES:
        raise InvalidRecord(f"{where}: 'role' must be one of {list(OPENAI_ROLES)}, got {role!r}")
    calls = turn.get("tool_calls") if role == "assistant" else None
    content, extra = _content(turn.get("content"), f"{where}.content", allow_empty=bool(calls))
    tools = extra.pop("tools", None)
    if role != "assistant" and extra:
        raise InvalidRecord(f"{where}.content: {' and '.join(sorted(extra))} parts belong to assistant turns")
    message: Message = {"role": role, "content": content, **extra}
    if calls:
        message["tool_calls"] = _openai_tool_calls(calls, f"{where}.tool_calls")
    reasoning = turn.get("reasoning_content") if role == "assistant" else None
    if reasoning is not None:
        message["reasoning_content"] = require_text(reasoning, f"{where}.reasoning_content", allow_empty=True)
    if _loss_weight(turn, role, where) == 0:
        message["weight"] = 0
    return message, tools


def openai_messages(fields: dict[str, Any], key: str) -> tuple[list[Message], list[Any] | None]:
    """The messages of the list under `key` (errors name it: `key[i]`), and the tools (the record's `tools`, or a
    message's `tools` part)."""
    messages: list[Message] = []
    tools = fields.get("tools")
    for index, turn in enumerate(_list_field(fields, key)):
        message, part_tools = openai_message(turn, f"{key}[{index}]")
        tools = tools if part_tools is None else part_tools
        messages.append(message)
    return messages, parse_tools(tools)


def check_weights(messages: list[Message]) -> None:
    """Some assistant turn is a target."""
    if all(m.get("weight") == 0 for m in messages if m["role"] == "assistant"):
        raise InvalidRecord("every assistant turn has weight 0; nothing to train on")


def normalize_openai(record: object) -> Conversation:
    """OpenAI `messages` with `role`/`content` (a string or parts), `tool_calls`, `weight` 0/1, `tools`; also
    LLaMA-Factory v1's messages (`{"type", "value"}` content parts, `loss_weight` 0/1)."""
    conversation = to_conversation(*openai_messages(_object(record, "messages"), "messages"))
    check_weights(conversation["messages"])
    return conversation


def alpaca_prompt(record: object) -> list[Message]:
    """An alpaca record's turns before its answer: `system`, the `history` pairs, then `instruction` and `input`."""
    fields = _object(record, "instruction")
    # LLaMA-Factory's rule: the prompt is the instruction, then the input on the next line.
    prompt = "\n".join(part for part in (optional_text(fields, "instruction"), optional_text(fields, "input")) if part)
    if not prompt:
        raise InvalidRecord("instruction: empty text (and no input)")
    messages: list[Message] = []
    system = optional_text(fields, "system")
    if system is not None:
        messages.append({"role": "system", "content": system})
    history = fields.get("history") or []
    if not isinstance(history, list):
        raise InvalidRecord(f"history: expected a list of [query, response] pairs, got {type_name(history)}")
    for index, pair in enumerate(history):
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise InvalidRecord(f"history[{index}]: expected a [query, response] pair, got {type_name(pair)}")
        messages.append({"role": "user", "content": require_text(pair[0], f"history[{index}][0]")})
        messages.append({"role": "assistant", "content": require_text(pair[1], f"history[{index}][1]")})
    messages.append({"role": "user", "content": prompt})
    return messages


def normalize_alpaca(record: object) -> Conversation:
    """Alpaca `instruction`, `input`, `output`, optional `system` and `history` ([[query, response], ...])."""
    messages = alpaca_prompt(record)
    assert isinstance(record, dict)  # checked by alpaca_prompt
    messages.append({"role": "assistant", "content": require_text(record.get("output"), "output")})
    return to_conversation(messages, None)


def normalize_text(record: object) -> Conversation:
    """Plain text: a `text` string, trained whole."""
    return {"text": require_text(_object(record, "text").get("text"), "text")}


NORMALIZERS: dict[str, Callable[[object], Conversation]] = {
    "qwen": normalize_qwen,
    "sharegpt": normalize_sharegpt,
    "openai": normalize_openai,
    "alpaca": normalize_alpaca,
    "text": normalize_text,
}


def _vote(record: object) -> tuple[str | None, str]:
    """The format one record suggests, with the reason (None when it suggests none)."""
    if not isinstance(record, dict):
        return None, ""
    turns = record.get("conversations")
    if isinstance(turns, list):
        tags = {t["from"] for t in turns if isinstance(t, dict) and isinstance(t.get("from"), str)}
        if tags & SHAREGPT_ONLY:
            return "sharegpt", f"'conversations' with 'from' {sorted(tags & SHAREGPT_ONLY)}"
        if tags & {"user", "assistant"}:
            return "qwen", "'conversations' with 'from' user/assistant"
        return None, ""
    if isinstance(record.get("messages"), list):
        return "openai", "'messages' list"
    if "instruction" in record and "output" in record:
        return "alpaca", "'instruction' and 'output'"
    if isinstance(record.get("text"), str):
        return "text", "'text' string"
    return None, ""


def detect_format(url: str, samples: list[object]) -> tuple[str, str]:
    """(format, reason) of a file from its first records; a ValueError explaining why it cannot tell."""
    votes = {fmt: reason for fmt, reason in map(_vote, samples) if fmt}
    if len(votes) == 1:
        fmt, reason = next(iter(votes.items()))
        return fmt, reason
    pass_format = f"pass --format {'|'.join(FORMATS)} (data.format)"
    if len(votes) > 1:
        raise ValueError(f"cannot tell the format of {url}: its first records look like {sorted(votes)}; {pass_format}")
    if not samples:
        raise ValueError(f"cannot tell the format of {url}: its first records are not valid JSON; {pass_format}")
    keys = sorted({key for s in samples if isinstance(s, dict) for key in s})
    what = f"records have keys {keys}" if keys else f"records are {sorted({type_name(s) for s in samples})}"
    raise ValueError(f"cannot tell the format of {url}: {what}; {pass_format}")
