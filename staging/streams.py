"""The sources of a dataset as staging reads them: `data.sources` (or `data.source` alone), then `data.eval_source`,
each resolved (a dataset_info.json entry gives its files, format, mapping and cap), and the train sources mixed.

Mixing is deterministic: `concat` reads the sources one after the other; `interleave` takes records in turn by
weight (a smooth weighted round robin: with weights 2 and 1, two records of the first per record of the second,
spread evenly) and stops when the first source runs out, as LLaMA-Factory's `interleave_under` does, so each
source's share of the result follows its weight. A cap (`max_records`, or an entry's `num_samples`) counts valid
records; invalid ones are rejected as they are met and never count.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from config.sections.run_data import DataConfig
from core.errors import UserError
from staging.catalog import is_reference, read_entry
from staging.mapping import Mapping
from storage.location import Location, Options

T = TypeVar("T")


@dataclass(frozen=True)
class Stream:
    """One configured source, resolved: its config key, where its records are, how to read them, its share."""

    key: str  # data.source, data.sources[i] or data.eval_source: what messages name
    source: str
    mapping: Mapping
    weight: float = 1.0
    max_records: int | None = None
    entry: str | None = None  # the dataset_info.json reference it came from
    options: Options = field(default_factory=dict, compare=False)  # data.storage_options

    @property
    def location(self) -> Location:
        """Where its records are, reached with data.storage_options."""
        return Location(self.source, self.options)

    @property
    def is_eval(self) -> bool:
        """Whether its records are the eval split."""
        return self.key == "data.eval_source"

    def describe(self) -> dict[str, Any]:
        """What identifies how it is read (for the source key and the manifest)."""
        return {
            "key": self.key,
            "source": self.source,
            "entry": self.entry,
            "format": self.mapping.format,
            "columns": self.mapping.columns,
            "tags": self.mapping.tags,
            "weight": self.weight,
            "max_records": self.max_records,
        }


def label(data: DataConfig) -> str:
    """How messages name the training data: `data.source URL`, or `data.sources` when several are mixed."""
    return "data.sources" if data.sources else f"data.source {data.source}"


def _stream(
    key: str,
    source: str,
    fmt: str,
    columns: dict[str, str],
    tags: dict[str, str],
    options: Options,
    weight: float | None = None,
    max_records: int | None = None,
) -> Stream:
    entry = None
    if is_reference(source):
        entry, found = source, read_entry(source, key, options)
        # The config's own settings win over the entry's (as LLaMA-Factory's command line over its file).
        source, fmt = found.source, fmt if fmt != "auto" else found.format
        columns, tags = columns or found.columns, tags or found.tags
        max_records = max_records or found.max_records
    mapping = Mapping(fmt, dict(columns), dict(tags))
    if fmt != "auto" and (problem := mapping.problem()):
        raise UserError(f"{key}: {problem}")
    return Stream(key, source, mapping, weight or 1.0, max_records, entry, options)


def resolve(data: DataConfig) -> list[Stream]:
    """The train streams in order, then the eval stream (when data.eval_source is set)."""
    options = dict(data.storage_options)
    if data.sources:
        out = [
            _stream(f"data.sources[{i}]", s.source, s.format, s.columns, s.tags, options, s.weight, s.max_records)
            for i, s in enumerate(data.sources)
        ]
    else:
        out = [_stream("data.source", data.source, data.format, data.columns, data.tags, options)]
    if data.eval_source:
        out.append(_stream("data.eval_source", data.eval_source, data.format, data.columns, data.tags, options))
    return out


def capped(items: Iterator[tuple[bool, T]], cap: int | None) -> Iterator[tuple[bool, T]]:
    """(valid, item) pairs up to the cap-th valid one (None: all)."""
    taken = 0
    for valid, item in items:
        if cap is not None and valid and taken >= cap:
            return
        yield valid, item
        taken += valid


def interleave(sources: list[Iterator[tuple[bool, T]]], weights: list[float]) -> Iterator[tuple[bool, T]]:
    """Valid items taken in turn by weight (smooth weighted round robin), until the first source runs out;
    invalid items pass through as they are met."""
    credit = [0.0] * len(sources)
    total = sum(weights)
    while True:
        for i, weight in enumerate(weights):
            credit[i] += weight
        chosen = max(range(len(sources)), key=lambda i: (credit[i], -i))
        credit[chosen] -= total
        for valid, item in sources[chosen]:
            yield valid, item
            if valid:
                break
        else:
            return
