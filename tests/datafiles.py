"""Small data files written for tests, in every format Tandem reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The sample conversations the demo stages (data/sample/).
SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample" / "conversations.json"


def write_jsonl(path: Path, records: list[Any]) -> str:
    """JSON Lines, one record per line."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def write_json(path: Path, records: list[Any]) -> str:
    """A pretty-printed JSON array (records span several lines, like the sample)."""
    path.write_text(json.dumps(records, indent=1), encoding="utf-8")
    return str(path)


def write_parquet(path: Path, records: list[dict[str, Any]]) -> str:
    """A Parquet file with one row per record (nested columns for turns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(records), path)
    return str(path)


def qwen(*turns: tuple[str, str], **extra: Any) -> dict[str, Any]:
    """A Qwen `conversations` record from (from, value) pairs."""
    return {"conversations": [{"from": role, "value": text} for role, text in turns], **extra}


def openai(*turns: tuple[str, Any], **extra: Any) -> dict[str, Any]:
    """An OpenAI `messages` record from (role, content) pairs."""
    return {"messages": [{"role": role, "content": content} for role, content in turns], **extra}


def arithmetic(n: int, start: int = 0) -> list[dict[str, Any]]:
    """n distinct single-turn Qwen records in the sample's vocabulary."""
    return [
        qwen(("user", f"What is {i} plus {i + 7}?"), ("assistant", f"{i} plus {i + 7} is {2 * i + 7}."))
        for i in range(start, start + n)
    ]


def read_records(source: str, fmt: str, mapping: Any = None, preference: str = "refuse") -> list[Any]:
    """Every record of a source (file, directory, glob, URL) through staging's reader, normalized; the first invalid
    one raises with its location (what staging does with `data.on_invalid: fail`), and records labelled undesirable
    (data.preference=chosen) are left out."""
    from core.errors import UserError
    from staging.mapping import Mapping
    from staging.records import Reject, Undesirable, open_file
    from staging.sources import expand
    from storage.location import Location

    records = []
    for url in expand(Location(source), "data.source"):
        for item in open_file(url, mapping or Mapping(fmt), preference, lambda _: None).items:
            if isinstance(item, Undesirable):
                continue
            if isinstance(item, Reject):
                raise item.error()
            records.append(item)
    if not records:
        raise UserError(f"data.source {source}: no records; it must hold at least one conversation")
    return records
