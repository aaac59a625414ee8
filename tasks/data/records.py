"""Read data files and normalize records to one chat form: a list of {"role", "content"} messages.

Every problem is reported with its exact location: `path:line` (JSONL) or `path[index]` (JSON array).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

from config.errors import UserError
from config.storage import filesystem

Message = dict[str, str]
QWEN_ROLES = {"system": "system", "user": "user", "assistant": "assistant"}


class RecordError(UserError):
    """A record that cannot be used; the message starts with its location."""


@dataclass(frozen=True)
class Record:
    """One normalized conversation and where it came from."""

    location: str
    messages: tuple[tuple[str, str], ...]


def read_raw(url: str) -> Iterator[tuple[str, object]]:
    """(location, parsed record) for every record of a JSON array or JSONL file."""
    fs, path = filesystem(url)
    with fs.open(path, "rb") as handle:
        text = handle.read().decode("utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RecordError(f"{url}:{exc.lineno}: malformed JSON ({exc.msg})") from None
        for index, record in enumerate(records):
            yield f"{url}[{index}]", record
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"{url}:{lineno}", json.loads(line)
        except json.JSONDecodeError as exc:
            raise RecordError(f"{url}:{lineno}: malformed JSON ({exc.msg})") from None


def detect_format(url: str, record: object) -> str:
    """The format of a file, decided from its first record."""
    if isinstance(record, dict) and isinstance(record.get("conversations"), list):
        return "qwen"
    keys = sorted(record) if isinstance(record, dict) else type(record).__name__
    raise UserError(f"cannot tell the format of {url}: records have keys {keys}; pass --set data.format=qwen")


def normalize_qwen(location: str, record: object) -> Record:
    """A Qwen `conversations` record as a Record; a RecordError naming the location and the reason."""
    if not isinstance(record, dict) or not isinstance(record.get("conversations"), list):
        raise RecordError(f"{location}: expected an object with a 'conversations' list")
    messages: list[tuple[str, str]] = []
    for turn_index, turn in enumerate(record["conversations"]):
        where = f"{location}.conversations[{turn_index}]"
        if not isinstance(turn, dict):
            raise RecordError(f"{where}: expected an object with 'from' and 'value', got {type(turn).__name__}")
        role = QWEN_ROLES.get(turn.get("from"))  # type: ignore[arg-type]
        if role is None:
            raise RecordError(f"{where}: 'from' must be one of {sorted(QWEN_ROLES)}, got {turn.get('from')!r}")
        value = turn.get("value")
        if not isinstance(value, str):
            raise RecordError(f"{where}: 'value' must be a string, got {type(value).__name__}")
        if not value.strip():
            raise RecordError(f"{where}: empty text")
        messages.append((role, value))
    check_order(location, messages)
    return Record(location, tuple(messages))


def check_order(location: str, messages: list[tuple[str, str]]) -> None:
    """System first (optional), then user/assistant alternating, ending with an assistant turn."""
    roles = [role for role, _ in messages]
    body = roles[1:] if roles and roles[0] == "system" else roles
    if "assistant" not in body:
        raise RecordError(f"{location}: no assistant turn")
    for index, role in enumerate(body):
        expected = "user" if index % 2 == 0 else "assistant"
        if role != expected:
            raise RecordError(f"{location}: roles out of order: turn {index} is {role!r}, expected {expected!r}")
    if body[-1] != "assistant":
        raise RecordError(f"{location}: the last turn is {body[-1]!r}; a conversation must end with the assistant")


def read_records(url: str, fmt: str) -> list[Record]:
    """Every record of a file, normalized; the first invalid record stops with its location."""
    records: list[Record] = []
    for location, raw in read_raw(url):
        if fmt == "auto":
            fmt = detect_format(url, raw)
        records.append(normalize_qwen(location, raw))
    if not records:
        raise UserError(f"{url}: no records; data.source must hold at least one conversation")
    return records
