"""LLaMA-Factory's `dataset_info.json` as a source: `path/dataset_info.json#name` names one of its entries, whose
`file_name` (relative to the json), `formatting`, `columns`, `tags`, `split` and `num_samples` are honoured.

An alpaca entry whose only column is `prompt` is LLaMA-Factory's pre-training form: Tandem reads it as `text`. A
preference entry (`ranking: true`, or a `kto_tag` column) maps its `chosen`/`rejected`/`kto_tag` columns like the
others; its records are preference data, which data.preference decides about (staging/preference.py).
An entry that names only a hub dataset (`hf_hub_url`, `ms_hub_url`, ...) is refused with a line saying to
download it: nothing is fetched from a hub here.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

import orjson

from config.sections.run_data import CATALOG_ENTRY, COLUMN_NAMES, TAG_NAMES, check_mapping
from core.errors import UserError
from storage.fs import read_bytes
from storage.location import Location, Options

HUB_KEYS = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")
FORMATTINGS = ("alpaca", "sharegpt", "openai")


@dataclass(frozen=True)
class Entry:
    """What one dataset_info.json entry says: the data's place, its format and mapping, and its cap."""

    source: str
    format: str
    columns: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    max_records: int | None = None


def is_reference(source: str) -> bool:
    """Whether a source names a dataset_info.json entry (`path/dataset_info.json#name`)."""
    return CATALOG_ENTRY.match(source) is not None


def read_entry(reference: str, key: str, options: Options) -> Entry:
    """The entry a `path/dataset_info.json#name` reference names; a UserError naming `key` when it cannot be used."""
    match = CATALOG_ENTRY.match(reference)
    assert match, "read_entry needs a reference (is_reference)"
    path, name = match["path"], match["name"]
    where = f"{key}: {path}#{name}"
    try:
        doc = orjson.loads(read_bytes(Location(path, options)))
    except FileNotFoundError:
        raise UserError(f"{key}: {path} does not exist; give the path of a LLaMA-Factory dataset_info.json") from None
    except orjson.JSONDecodeError as exc:
        raise UserError(f"{key}: {path} is not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get(name), dict):
        names = ", ".join(sorted(doc)) if isinstance(doc, dict) else "none"
        raise UserError(f"{where}: no entry {name!r} in the file; its entries: {names}")
    entry = doc[name]
    if "file_name" not in entry:
        hub = next((k for k in HUB_KEYS if k in entry), None)
        if hub:
            raise UserError(
                f"{where}: the entry names a hub dataset ({hub}: {entry[hub]}), which Tandem does not "
                "download; download its files and give them as data.source, or add a file_name"
            )
        raise UserError(f"{where}: the entry has no file_name")
    formatting = entry.get("formatting", "alpaca")
    if formatting not in FORMATTINGS:
        raise UserError(f"{where}: formatting {formatting!r} is not one of {', '.join(FORMATTINGS)}")
    split = entry.get("split", "train")
    if split != "train":
        raise UserError(
            f"{where}: split {split!r}; a data file holds one split, 'train', as LLaMA-Factory reads "
            "it: give held-out data as data.eval_source"
        )
    try:
        columns = check_mapping(entry.get("columns") or {}, COLUMN_NAMES, f"{where} columns")
        tags = check_mapping(entry.get("tags") or {}, TAG_NAMES, f"{where} tags")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    fmt = "text" if formatting == "alpaca" and set(columns) == {"prompt"} else formatting
    file_name = str(entry["file_name"])
    source = (
        file_name
        if "://" in file_name or posixpath.isabs(file_name)
        else posixpath.join(posixpath.dirname(path), file_name)
    )
    samples = entry.get("num_samples")
    return Entry(source, fmt, columns, tags, int(samples) if samples else None)
