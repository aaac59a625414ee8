"""Records of one data file, normalized to the internal chat form or rejected with location and reason.

A location is `path:line` (JSONL and text), `path[index]` (JSON array) or `path#row` (Parquet); an error message is
`{location}: {reason}`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from core.errors import UserError
from staging.formats import DETECT_SAMPLE, NORMALIZERS, Conversation, InvalidRecord, detect_format
from staging.mapping import Mapping
from staging.sources import ByteCounter, Unparsable, is_text_file, read_file
from storage.fs import Where


class RecordError(UserError):
    """A record that cannot be used; the message starts with its location."""


@dataclass(frozen=True)
class Record:
    """One normalized conversation and where it came from."""

    location: str
    conversation: Conversation


@dataclass(frozen=True)
class Reject:
    """A record left out, with where it is and why."""

    location: str
    reason: str

    def error(self) -> RecordError:
        """The one-line error `on_invalid: fail` raises for it."""
        return RecordError(f"{self.location}: {self.reason} (or set data.on_invalid=skip to skip invalid records)")


@dataclass(frozen=True)
class DataFile:
    """A data file with the format its records are read in, and why."""

    url: Where
    format: str
    reason: str
    items: Iterator[Record | Reject]


def open_file(url: Where, mapping: Mapping, on_bytes: ByteCounter) -> DataFile:
    """A data file's records, renamed by the mapping's columns and tags, then normalized; with format `auto`,
    the format is decided from its first records."""
    raw = read_file(url, on_bytes)
    head = list(itertools.islice(raw, DETECT_SAMPLE))
    fmt, reason = mapping.format, "data.format"
    if not head:
        return DataFile(url, fmt, "empty file", iter(()))
    if is_text_file(url):
        if fmt not in ("auto", "text"):
            raise UserError(f"{url}: a .txt file is plain text, one example a line, not {fmt}; read it as auto or text")
        fmt, reason = "text", "a .txt file: one example a line"
    elif fmt == "auto":
        try:
            fmt, reason = detect_format(str(url), [value for _, value in head if not isinstance(value, Unparsable)])
        except ValueError as exc:
            raise UserError(str(exc)) from None
    items = (to_item(location, value, fmt, mapping) for location, value in itertools.chain(head, raw))
    return DataFile(url, fmt, reason, items)


def to_item(location: str, value: object, fmt: str, mapping: Mapping) -> Record | Reject:
    """A parsed record renamed by the mapping's columns and tags and normalized from format `fmt`, or rejected with
    the reason (in the user's keys)."""
    if isinstance(value, Unparsable):
        return Reject(location, value.reason)
    try:
        return Record(location, NORMALIZERS[fmt](mapping.apply(value)))
    except InvalidRecord as exc:
        return Reject(location, mapping.explain(str(exc)))
