"""Column and tag mappings (`data.columns`, `data.tags`, LLaMA-Factory's names): a record whose keys or role names
differ from a format's defaults is rewritten into that format's own keys before it is normalized, so every format
keeps one normalizer and one set of error messages.

    data.format: alpaca, data.columns: {prompt: question, response: answer}
        {"question": "2+2?", "answer": "4"}  ->  {"instruction": "2+2?", "output": "4"}
    data.format: sharegpt, data.tags: {role_tag: role, content_tag: content, user_tag: user, assistant_tag: bot}
        {"conversations": [{"role": "user", "content": "hi"}, ...]}  ->  {"conversations": [{"from": "human", ...}]}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The keys of preference data (staging/preference.py), for LLaMA-Factory's column names: a pair's answers, and KTO's
# label (LLaMA-Factory's `kto_tag`).
PREFERENCE_COLUMNS = {"chosen": "chosen", "rejected": "rejected", "kto_tag": "label"}
# Each format's own key for LLaMA-Factory's column names.
COLUMNS = {
    "alpaca": {
        "prompt": "instruction",
        "query": "input",
        "response": "output",
        "system": "system",
        "history": "history",
        "images": "images",
        **PREFERENCE_COLUMNS,
    },
    "sharegpt": {
        "messages": "conversations",
        "system": "system",
        "tools": "tools",
        "images": "images",
        **PREFERENCE_COLUMNS,
    },
    "qwen": {"messages": "conversations", "images": "images", **PREFERENCE_COLUMNS},
    "openai": {"messages": "messages", "tools": "tools", "images": "images", **PREFERENCE_COLUMNS},
    "text": {"prompt": "text"},
}
# Each format's own turn keys and role names, for LLaMA-Factory's tag names.
TURN_KEYS = {"sharegpt": ("from", "value"), "qwen": ("from", "value"), "openai": ("role", "content")}
ROLES = {
    "sharegpt": {
        "user_tag": "human",
        "assistant_tag": "gpt",
        "observation_tag": "observation",
        "function_tag": "function_call",
        "system_tag": "system",
    },
    "qwen": {"user_tag": "user", "assistant_tag": "assistant", "system_tag": "system"},
    "openai": {"user_tag": "user", "assistant_tag": "assistant", "observation_tag": "tool", "system_tag": "system"},
}


@dataclass(frozen=True)
class Mapping:
    """A format and where its fields are in the user's records."""

    format: str
    columns: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def problem(self) -> str | None:
        """Why this mapping cannot apply to its format (a column or tag the format does not have), or None."""
        names = COLUMNS[self.format]
        for name in self.columns:
            if name not in names:
                return f"column {name!r} is not one of format {self.format}'s: {', '.join(names)}"
        if self.tags and self.format not in TURN_KEYS:
            return f"format {self.format} has no turns to tag"
        for name in self.tags:
            if name not in ("role_tag", "content_tag") and name not in ROLES[self.format]:
                return f"tag {name!r} is not one of format {self.format}'s"
        return None

    def apply(self, record: object) -> object:
        """The record with the format's own keys and role names (records that are not objects pass unchanged)."""
        if not isinstance(record, dict) or not (self.columns or self.tags):
            return record
        own = COLUMNS[self.format]
        out = {key: value for key, value in record.items() if key not in self.columns.values()}
        for name, key in self.columns.items():
            if key in record:
                out[own[name]] = record[key]
        if self.tags and self.format in TURN_KEYS:
            # A pair's answers are turns too (one, or a list of them), named as the conversation's turns.
            for key in (own["messages"], "chosen", "rejected"):
                value = out.get(key)
                if isinstance(value, list):
                    out[key] = [self._turn(turn) for turn in value]
                elif isinstance(value, dict) and key != own["messages"]:
                    out[key] = self._turn(value)
        return out

    def column(self, key: str) -> str:
        """The user's key for one of the format's own keys (`label` -> the column `kto_tag` maps, if any)."""
        own = COLUMNS.get(self.format, {})
        return next((theirs for name, theirs in self.columns.items() if own.get(name) == key), key)

    def explain(self, reason: str) -> str:
        """A normalizer's reason in the user's keys: `output: empty text` -> `answer (column response): empty text`."""
        own = COLUMNS.get(self.format, {})
        for name, key in self.columns.items():
            mine = own[name]
            if reason.startswith((f"{mine}:", f"{mine}[", f"{mine}.")):
                where, _, rest = reason.partition(":")
                return f"{key}{where[len(mine) :]} (column {name}):{rest}"
            if reason.startswith(f"{mine!r}"):
                return f"{key!r} (column {name}){reason[len(repr(mine)) :]}"
        return reason

    def _turn(self, turn: Any) -> Any:
        if not isinstance(turn, dict):
            return turn
        role_key, content_key = TURN_KEYS[self.format]
        their_role, their_content = self.tags.get("role_tag", role_key), self.tags.get("content_tag", content_key)
        roles = {self.tags[name]: own for name, own in ROLES[self.format].items() if name in self.tags}
        out = {key: value for key, value in turn.items() if key not in (their_role, their_content)}
        role = turn.get(their_role)
        out[role_key] = roles.get(role, role) if isinstance(role, str) else role
        if their_content in turn:
            out[content_key] = turn[their_content]
        return out
