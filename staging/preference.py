"""Preference data as users have it, recognised, validated and normalized in one place: supervised fine-tuning
takes its desirable side (data.preference=chosen), a preference objective the pairs and labels (data.preference=pairs).

Forms, told by a record's keys after its source's column and tag mapping (staging/mapping.py):

    pairs     LLaMA-Factory ShareGPT  {"conversations": [...], "chosen": {"from": "gpt", ...}, "rejected": {...}}
              LLaMA-Factory OpenAI    {"messages": [...], "chosen": {"role": "assistant", ...}, "rejected": {...}}
              LLaMA-Factory alpaca    {"instruction": ..., "input": ..., "chosen": "...", "rejected": "..."}
              LLaMA-Factory v1        {"chosen_messages": [...], "rejected_messages": [...]}: two whole conversations
              TRL                     {"prompt": text or messages, "chosen": ..., "rejected": ...}, or "chosen" and
                                      "rejected" conversations alone (their common start is the prompt)
    feedback  KTO, unpaired           a conversation (ShareGPT, OpenAI, alpaca, or TRL's "prompt" + "completion")
                                      with a boolean "label" (LLaMA-Factory's "kto_tag")

A pair normalizes to `Pair` (the prompt's messages, the chosen and the rejected answer, the tools), feedback to
`Feedback` (a conversation, and whether its answer is desirable). An answer is one turn, a list of turns or a
string (an assistant turn). `desirable` is what supervised training gets: a pair's prompt and chosen answer, a
conversation labelled true, and nothing of a rejected answer or of a conversation labelled false.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from config.objectives import FEEDBACK_DATA, PAIR_DATA, either, trained_on
from staging.formats import (
    NORMALIZERS,
    QWEN_ROLES,
    SHAREGPT_ROLES,
    Conversation,
    InvalidRecord,
    Message,
    alpaca_prompt,
    check_order,
    check_weights,
    from_value_turn,
    openai_message,
    openai_messages,
    parse_tools,
    require_text,
    sharegpt_messages,
    to_conversation,
    type_name,
)

PAIR_KEYS = ("chosen", "rejected")
V1_KEYS = ("chosen_messages", "rejected_messages")
Turn = Callable[[object, str], Message]  # parses one turn of an answer, naming `where` in its errors


@dataclass(frozen=True)
class Form:
    """One form of preference data: its name, kind (pairs or feedback), the chat format of its messages (None:
    ShareGPT or Qwen turns, told by their role names) and how users know it."""

    name: str
    kind: str
    format: str | None
    label: str


FORMS = {
    form.name: form
    for form in (
        Form("sharegpt pairs", "pairs", None, "LLaMA-Factory's ShareGPT pairs"),
        Form("openai pairs", "pairs", "openai", "LLaMA-Factory's OpenAI-style pairs"),
        Form("alpaca pairs", "pairs", "alpaca", "LLaMA-Factory's alpaca pairs"),
        Form("v1 pairs", "pairs", "openai", "LLaMA-Factory v1's pairs"),
        Form("trl pairs", "pairs", "openai", "TRL's preference pairs"),
        Form("sharegpt feedback", "feedback", None, "KTO feedback on ShareGPT conversations"),
        Form("openai feedback", "feedback", "openai", "KTO feedback on OpenAI messages"),
        Form("alpaca feedback", "feedback", "alpaca", "KTO feedback on alpaca records"),
        Form("trl feedback", "feedback", "openai", "TRL's unpaired KTO feedback"),
    )
}
# The key whose presence tells each base of a pair or of feedback, in order.
BASES = (("conversations", "sharegpt"), ("messages", "openai"), ("instruction", "alpaca"))


@dataclass(frozen=True)
class Pair:
    """Two answers to one prompt, the chosen one preferred."""

    prompt: list[Message]
    chosen: list[Message]
    rejected: list[Message]
    tools: list[Any] | None = None


@dataclass(frozen=True)
class Feedback:
    """One conversation, with whether its (last) answer is desirable (KTO's label)."""

    conversation: Conversation
    desirable: bool


def label_key(record: dict[str, Any]) -> str | None:
    """The key of a record's KTO label: LLaMA-Factory's `kto_tag`, or a boolean `label` (a label of another type is
    some other annotation, not feedback)."""
    if "kto_tag" in record:
        return "kto_tag"
    return "label" if isinstance(record.get("label"), bool) else None


def form_of(record: object) -> Form | None:
    """The preference form a record is in, or None for supervised data."""
    if not isinstance(record, dict):
        return None
    if any(key in record for key in V1_KEYS):
        return FORMS["v1 pairs"]
    if any(key in record for key in PAIR_KEYS):
        return FORMS[next((f"{base} pairs" for key, base in BASES if key in record), "trl pairs")]
    if label_key(record) is not None:
        # Feedback labels a conversation; a label beside anything else (`text`: a classifier's data) is not KTO's.
        base = next((base for key, base in (*BASES, ("completion", "trl")) if key in record), None)
        return FORMS[f"{base} feedback"] if base else None
    return None


def form_columns(form: Form, record: dict[str, Any]) -> list[str]:
    """The keys that make a record preference data (the format's own keys)."""
    if form.kind == "feedback":
        return [label_key(record) or "label"]
    return [key for key in (V1_KEYS if form.name == "v1 pairs" else PAIR_KEYS) if key in record]


def refusal(form: Form, columns: list[str]) -> str:
    """Why supervised fine-tuning refuses preference data (data.preference=refuse), and what to do."""
    found = f"preference data ({form.label}: column{'s' if len(columns) > 1 else ''} {', '.join(map(repr, columns))})"
    if form.kind == "pairs":
        return (
            f"{found}, which supervised fine-tuning would mistrain: it has no place for the rejected answers; set "
            "data.preference=chosen to train on the prompts and chosen answers only (rejected answers are never "
            f"targets), or train it with a preference objective (train.objective={either(trained_on(PAIR_DATA))}, "
            "which stages its pairs)"
        )
    return (
        f"{found}, which supervised fine-tuning would mistrain: it would imitate the answers labelled false; set "
        "data.preference=chosen to train on the records labelled true only (those labelled false are left out and "
        f"listed in rejects.jsonl), or train it with a preference objective (train.objective="
        f"{either(trained_on(FEEDBACK_DATA))}, which stages its labelled answers)"
    )


def undesirable_reason(column: str) -> str:
    """The rejects.jsonl reason of a record labelled false under data.preference=chosen."""
    return f"labelled undesirable ({column}: false): left out by data.preference=chosen, never a target"


def normalize(form: Form, record: dict[str, Any], fmt: str) -> Pair | Feedback:
    """A preference record checked and normalized; `fmt` is the file's format (Qwen or ShareGPT role names)."""
    if form.kind == "feedback":
        return _feedback(form, record, fmt)
    return PAIRS[form.name](record, fmt)


def desirable(item: Pair | Feedback) -> Conversation | None:
    """The conversation supervised training gets from a preference record: a pair's prompt and chosen answer, or a
    desirable conversation; None for a conversation labelled false."""
    if isinstance(item, Feedback):
        return item.conversation if item.desirable else None
    conversation = to_conversation(item.prompt + item.chosen, item.tools)
    check_weights(conversation["messages"])
    return conversation


def _roles(fmt: str) -> dict[str, str]:
    return QWEN_ROLES if fmt == "qwen" else SHAREGPT_ROLES


def _openai_turn(value: object, where: str) -> Message:
    return openai_message(value, where)[0]


def _turns(record: dict[str, Any], key: str, role: str, turn: Turn) -> list[Message]:
    """The turns under `key`: one turn, a list of turns, or a string (one turn of `role`)."""
    if key not in record:
        need = "; a pair needs a 'chosen' and a 'rejected' answer" if key in PAIR_KEYS else ""
        raise InvalidRecord(f"{key!r}: missing{need}")
    value = record[key]
    if isinstance(value, str):
        return [{"role": role, "content": require_text(value, key)}]
    if isinstance(value, dict):
        return [turn(value, key)]
    if isinstance(value, list) and value:
        return [turn(item, f"{key}[{index}]") for index, item in enumerate(value)]
    raise InvalidRecord(f"{key}: expected a string, a turn or a list of turns, got {type_name(value)}")


def _pair(prompt: list[Message], chosen: list[Message], rejected: list[Message], tools: list[Any] | None) -> Pair:
    """A pair whose prompt is followed by each answer in a valid order, with two different answers."""
    if not prompt:
        raise InvalidRecord("the prompt is empty; a pair is two answers to one prompt")
    for key, answer in (("chosen", chosen), ("rejected", rejected)):
        if answer[0]["role"] != "assistant":
            raise InvalidRecord(f"{key}: an answer is the assistant's, got a {answer[0]['role']!r} turn")
        try:
            check_order(prompt + answer)
        except InvalidRecord as exc:
            raise InvalidRecord(f"{key}: {exc}") from None
    if chosen == rejected:
        raise InvalidRecord("'chosen' and 'rejected' are the same answer; a pair needs two different ones")
    return Pair(prompt, chosen, rejected, tools)


def _split(chosen: list[Message], rejected: list[Message], tools: list[Any] | None, keys: tuple[str, str]) -> Pair:
    """A pair from two whole conversations: their common start, up to the answers, is the prompt."""
    for key, messages in zip(keys, (chosen, rejected), strict=True):
        try:
            check_order(messages)
        except InvalidRecord as exc:
            raise InvalidRecord(f"{key}: {exc}") from None
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    while shared and chosen[shared - 1]["role"] == "assistant":  # a shared answer is part of the answers
        shared -= 1
    if not shared:
        raise InvalidRecord(f"{keys[0]!r} and {keys[1]!r} share no prompt; a pair is two answers to one prompt")
    return _pair(chosen[:shared], chosen[shared:], rejected[shared:], tools)


def _conversation_pair(record: dict[str, Any], fmt: str) -> Pair:
    prompt, tools = sharegpt_messages(record, _roles(fmt))

    def turn(value: object, where: str) -> Message:
        return from_value_turn(value, where, _roles(fmt))

    return _pair(
        prompt, _turns(record, "chosen", "assistant", turn), _turns(record, "rejected", "assistant", turn), tools
    )


def _openai_pair(record: dict[str, Any], fmt: str) -> Pair:
    prompt, tools = openai_messages(record, "messages")
    chosen, rejected = (_turns(record, key, "assistant", _openai_turn) for key in PAIR_KEYS)
    return _pair(prompt, chosen, rejected, tools)


def _alpaca_pair(record: dict[str, Any], fmt: str) -> Pair:
    chosen, rejected = (_turns(record, key, "assistant", _openai_turn) for key in PAIR_KEYS)
    return _pair(alpaca_prompt(record), chosen, rejected, None)


def _v1_pair(record: dict[str, Any], fmt: str) -> Pair:
    chosen, tools = openai_messages(record, V1_KEYS[0])
    rejected, _ = openai_messages(record, V1_KEYS[1])
    return _split(chosen, rejected, tools, V1_KEYS)


def _trl_pair(record: dict[str, Any], fmt: str) -> Pair:
    tools = parse_tools(record.get("tools"))
    if "prompt" in record:
        prompt = _turns(record, "prompt", "user", _openai_turn)
        chosen, rejected = (_turns(record, key, "assistant", _openai_turn) for key in PAIR_KEYS)
        return _pair(prompt, chosen, rejected, tools)
    if any(isinstance(record.get(key), str) for key in PAIR_KEYS):
        raise InvalidRecord(
            "'chosen' and 'rejected' are texts without a 'prompt' (TRL's implicit-prompt text form), which Tandem "
            "does not read; add the 'prompt', or give both as conversations"
        )
    chosen, _ = openai_messages(record, "chosen")
    rejected, _ = openai_messages(record, "rejected")
    return _split(chosen, rejected, tools, PAIR_KEYS)


PAIRS: dict[str, Callable[[dict[str, Any], str], Pair]] = {
    "sharegpt pairs": _conversation_pair,
    "openai pairs": _openai_pair,
    "alpaca pairs": _alpaca_pair,
    "v1 pairs": _v1_pair,
    "trl pairs": _trl_pair,
}


def _feedback(form: Form, record: dict[str, Any], fmt: str) -> Feedback:
    """A KTO record: its conversation, checked as supervised data of its base format, and its boolean label."""
    if form.name == "trl feedback":
        prompt = _turns(record, "prompt", "user", _openai_turn)
        completion = _turns(record, "completion", "assistant", _openai_turn)
        conversation = to_conversation(prompt + completion, parse_tools(record.get("tools")))
    else:
        base = form.format or ("qwen" if fmt == "qwen" else "sharegpt")
        conversation = NORMALIZERS[base](record)
    key = label_key(record) or "label"
    if key not in record:
        raise InvalidRecord(f"{key!r}: missing; KTO feedback labels every record true or false")
    label = record[key]
    if not isinstance(label, bool):
        raise InvalidRecord(f"{key}: expected true or false (a desirable answer or not), got {label!r}")
    return Feedback(conversation, label)


def staged(item: Pair | Feedback) -> dict[str, Any]:
    """A preference record as it is spooled for data.preference=pairs (staging/pairs.py tokenizes it): a pair's
    prompt `messages`, its `chosen` and `rejected` answers; feedback's conversation and `desirable`."""
    if isinstance(item, Feedback):
        return {**item.conversation, "desirable": item.desirable}
    out: dict[str, Any] = {"messages": item.prompt, "chosen": item.chosen, "rejected": item.rejected}
    if item.tools is not None:
        out["tools"] = item.tools
    return out


def supervised_refusal() -> str:
    """Why data.preference=pairs rejects a supervised record."""
    return (
        "not preference data (no 'chosen'/'rejected' answers, no KTO label); data.preference=pairs stages pairs and "
        "KTO feedback only: give it in its own run, with data.preference=chosen or refuse"
    )
