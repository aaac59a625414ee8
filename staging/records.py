"""Records of one data file, normalized to the internal chat form or rejected with location and reason.

A location is `path:line` (JSONL and text), `path[index]` (JSON array) or `path#row` (Parquet); an error message is
`{location}: {reason}`. A file's format is decided once, from its first records (`auto`), and so is whether it is
preference data (staging/preference.py): refused in one line naming the file by default (data.preference=refuse),
else each record's desirable side is staged and a KTO record labelled false is an `Undesirable`, left out and
counted, never an invalid record.
"""

from __future__ import annotations

import itertools
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass, field

from core.errors import UserError
from staging import prompts
from staging.formats import DETECT_SAMPLE, NORMALIZERS, Conversation, InvalidRecord, detect_format
from staging.images import image_reader, lift_image_parts, with_images
from staging.mapping import Mapping
from staging.preference import (
    Form,
    desirable,
    form_columns,
    form_of,
    label_key,
    normalize,
    refusal,
    staged,
    supervised_refusal,
    undesirable_reason,
)
from staging.sources import ByteCounter, Unparsable, is_text_file, read_file
from storage.location import Location


class RecordError(UserError):
    """A record that cannot be used; the message starts with its location."""


@dataclass(frozen=True)
class Record:
    """One normalized conversation and where it came from; `images`: where each image it names was read."""

    location: str
    conversation: Conversation
    images: dict[str, Location] = field(default_factory=dict)


@dataclass(frozen=True)
class Reject:
    """A record left out, with where it is and why."""

    location: str
    reason: str

    def error(self) -> RecordError:
        """The one-line error `on_invalid: fail` raises for it."""
        return RecordError(f"{self.location}: {self.reason} (or set data.on_invalid=skip to skip invalid records)")


@dataclass(frozen=True)
class Undesirable(Reject):
    """A KTO record labelled false under data.preference=chosen: not staged, listed in rejects.jsonl and counted
    apart; not invalid, so data.on_invalid=fail does not stop on it."""


@dataclass(frozen=True)
class Images:
    """How a file's images are read: its folder (their paths are relative to it), the digest that names them
    (data.digest_algorithm), and whether the model reads images at all (a text-only model refuses them)."""

    folder: Location
    algorithm: str = "blake3"
    model: str | None = None  # model.name_or_path of a text-only model: records with images are refused

    def refusal(self, location: str) -> UserError:
        """The one line for image records staged for a text-only model."""
        return UserError(
            f"{location}: a record with images, but {self.model} is a text-only model (its config.json has no "
            "vision_config); train a vision-language model (Qwen2.5-VL, Qwen3-VL) or give data without images"
        )


@dataclass(frozen=True)
class Reading:
    """How a file's records are read: its format, the source's mapping, data.preference, the preference form
    its first records are in (None: supervised data), and how its images are read (None: as a text file's)."""

    format: str
    mapping: Mapping
    preference: str
    form: Form | None = None
    images: Images | None = None
    require_answer: bool = False  # data.require_answer (prompt records: data.preference=prompts)


@dataclass(frozen=True)
class DataFile:
    """A data file with how its records are read, and why in that format."""

    url: Location
    reading: Reading
    reason: str
    items: Iterator[Record | Reject]

    @property
    def format(self) -> str:
        """The format its records are read in."""
        return self.reading.format


def open_file(
    url: Location,
    mapping: Mapping,
    preference: str,
    on_bytes: ByteCounter,
    images: Images | None = None,
    require_answer: bool = False,
) -> DataFile:
    """A data file's records, renamed by the mapping's columns and tags, then normalized; with format `auto`,
    the format is decided from its first records, and so is whether it is preference data (`preference`:
    data.preference); data.preference=prompts reads prompt records (staging/prompts.py) whatever the format.
    `images`: how its records' images are read (None: from the file's folder, as blake3)."""
    images = images or Images(url.with_url(posixpath.dirname(url.url)))
    raw = read_file(url, on_bytes)
    head = list(itertools.islice(raw, DETECT_SAMPLE))
    if not head:
        return DataFile(url, Reading(mapping.format, mapping, preference, images=images), "empty file", iter(()))
    samples = [mapping.apply(value) for _, value in head if not isinstance(value, Unparsable)]
    if preference == "prompts":
        key = next((prompts.form_of(sample) for sample in samples if prompts.form_of(sample)), None)
        if key is None and samples:
            raise UserError(f"{url}: its first records are {prompts.refusal(samples[0])}")
        reading = Reading("prompts", mapping, preference, require_answer=require_answer)
        items = (to_item(location, value, reading) for location, value in itertools.chain(head, raw))
        return DataFile(url, reading, prompts.form_label(key), items)
    first = next((sample for sample in samples if isinstance(sample, dict) and form_of(sample)), None)
    form = form_of(first)
    if first is not None and form is not None and preference == "refuse":
        raise UserError(f"{url}: {refusal(form, [mapping.column(key) for key in form_columns(form, first)])}")
    if form is None and preference == "pairs" and samples:
        raise UserError(f"{url}: its first records are {supervised_refusal()}")
    fmt, reason = file_format(url, mapping.format, samples, form)
    reading = Reading(fmt, mapping, preference, form, images)
    items = (to_item(location, value, reading) for location, value in itertools.chain(head, raw))
    return DataFile(url, reading, reason, items)


def file_format(url: Location, fmt: str, samples: list[object], form: Form | None) -> tuple[str, str]:
    """(format, why) of a file: a text file is plain text, a given format is taken, `auto` is decided from the
    first records (a preference form names its own)."""
    if is_text_file(url):
        if fmt not in ("auto", "text"):
            raise UserError(f"{url}: a .txt file is plain text, one example a line, not {fmt}; read it as auto or text")
        return "text", "a .txt file: one example a line"
    if fmt != "auto":
        return fmt, "data.format" + (f", {form.label}" if form else "")
    if form is not None and form.format is not None:
        return form.format, form.label
    try:
        fmt, reason = detect_format(str(url), samples)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return fmt, form.label if form else reason


def to_item(location: str, value: object, reading: Reading) -> Record | Reject:
    """A parsed record renamed by the mapping's columns and tags and normalized from the file's format (or its
    preference form), or rejected with the reason (in the user's keys)."""
    if isinstance(value, Unparsable):
        return Reject(location, value.reason)
    mapping = reading.mapping
    try:
        record = mapping.apply(value)
        if reading.preference == "prompts":
            return Record(location, prompts.normalize(location, record, reading.require_answer))
        form = reading.form or form_of(record)
        if form is None:
            if reading.preference == "pairs":
                return Reject(location, supervised_refusal())
            return Record(location, *supervised(location, record, reading))
        assert isinstance(record, dict)  # form_of found keys
        if "images" in record or "image" in record:
            return Reject(location, "preference data with images is not staged (images train supervised records)")
        if reading.preference == "refuse":  # a preference record among supervised ones
            return Reject(location, refusal(form, [mapping.column(key) for key in form_columns(form, record)]))
        if reading.preference == "pairs":
            return Record(location, staged(normalize(form, record, reading.format)))
        side = desirable(normalize(form, record, reading.format))
        if side is None:
            return Undesirable(location, undesirable_reason(mapping.column(label_key(record) or "label")))
        return Record(location, side)
    except InvalidRecord as exc:
        return Reject(location, mapping.explain(str(exc)))


def supervised(location: str, record: object, reading: Reading) -> tuple[Conversation, dict[str, Location]]:
    """A supervised record normalized from the file's format, its images (if any) found, checked and named by
    content (staging/images.py); a record with images for a text-only model stops staging."""
    lifted = lift_image_parts(record)
    conversation = with_images(NORMALIZERS[reading.format](lifted), lifted)
    images = reading.images
    if images is None:
        return conversation, {}
    if images.model is not None and "images" in conversation:
        raise images.refusal(location)
    return image_reader(images.algorithm).resolve(conversation, images.folder)
