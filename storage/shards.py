"""The dataset shards and their writer (tokenized examples -> shards of at most `shard_rows` rows, digested from the
bytes written); storage/split_reader.py reads them.

A shard is an Arrow IPC file (uncompressed, one record batch): a reader memory-maps it and takes any row by its
offsets without decoding anything, so a rank's memory holds the rows it trains on, not the split (see "On storage" in
docs/architecture.md for why this form). Columns: `input_ids` and `labels` (list<int32>, same length, -100 where a
token is not a target) and `length` (int32, for length-grouped batching). A packed dataset (`data.packing`) holds
several examples per row, one after the other, and adds `segments` (list<int32>: the lengths of the row's examples,
in order; they sum to `length`), so that readers can keep every example to itself. A shard is encoded in memory,
digested, and written under its final name atomically; the manifest that lists it is written after every shard (by
the caller). Datasets staged before this form hold the same columns as Parquet (`.parquet`); a node converts those
into its node cache on first use (storage/local_dataset.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from storage import layout
from storage.digest import digest_bytes
from storage.fs import write_bytes_atomic
from storage.location import Location, join

IGNORE_INDEX = -100  # a label that is not a target (Hugging Face's convention)
SHARD_SCHEMA = pa.schema(
    [("input_ids", pa.list_(pa.int32())), ("labels", pa.list_(pa.int32())), ("length", pa.int32())]
)
PACKED_SHARD_SCHEMA = SHARD_SCHEMA.append(pa.field("segments", pa.list_(pa.int32())))
# A dataset with images: each row names its images in order (`images`: their staged names, `{digest}.{ext}` under
# the dataset's images/) and each one's `<|image_pad|>` tokens (`image_tokens`), which stand in `input_ids`.
IMAGE_COLUMNS = [pa.field("images", pa.list_(pa.string())), pa.field("image_tokens", pa.list_(pa.int32()))]
ExampleImages = tuple[tuple[str, ...], tuple[int, ...]]  # an example's image names and each one's tokens
# A preference row (data.preference=pairs): `segments` is [prompt, chosen, rejected] tokens of a pair, or [prompt,
# answer, 0] of KTO feedback, one after the other in input_ids; `feedback` is -1 for a pair, else the label (1
# desirable, 0 undesirable).
PREFERENCE_SHARD_SCHEMA = PACKED_SHARD_SCHEMA.append(pa.field("feedback", pa.int8()))
PAIR = -1  # the `feedback` of a pair
# A prompt row (data.preference=prompts, online RL): the prompt's tokens (its chat template's rendering with the
# generation prompt; no target), and `record`: its location, prompt messages and other columns, as JSON
# (staging/prompts.py), which the reward functions receive.
PROMPT_SHARD_SCHEMA = SHARD_SCHEMA.append(pa.field("record", pa.large_string()))
FileEntry = dict[str, Any]


class Row(NamedTuple):
    """One row of a shard: its tokens, their labels, the lengths of the examples in it (one, unpacked), and its
    images' names and tokens, in order (none in a dataset without images)."""

    input_ids: Sequence[int]
    labels: Sequence[int]
    segments: Sequence[int]
    images: Sequence[str] = ()
    image_tokens: Sequence[int] = ()


def row(input_ids: Sequence[int], labels: Sequence[int]) -> Row:
    """A row holding one example."""
    return Row(input_ids, labels, [len(input_ids)])


def split_rows(counts: dict[str, int]) -> int:
    """Rows of a split from its manifest counts; manifests written before packing have one record per row."""
    return counts["rows"] if "rows" in counts else counts["records"]


class SplitWriter:
    """Collects one split's rows and writes them as shards, counting records, rows, tokens and targets."""

    def __init__(
        self,
        base: Location,
        split: str,
        shard_rows: int,
        algorithm: str,
        on_write: Callable[[FileEntry], None],
        packed: bool = False,
        images: bool = False,
    ) -> None:
        self.base, self.split, self.shard_rows, self.algorithm = base, split, shard_rows, algorithm
        self.on_write, self.packed, self.images = on_write, packed, images
        self._images: list[ExampleImages] = []  # per example, with `images`
        self.preference = False  # PreferenceWriter's rows
        self._pending_records: list[str] = []  # PromptWriter's rows' records, until their shard is written
        self._pending_feedback = np.zeros(0, dtype=np.int8)  # their labels, until their shard is written
        self.files: list[FileEntry] = []
        self.counts = {"records": 0, "rows": 0, "tokens": 0, "target_tokens": 0, "truncated": 0}
        if images:
            self.counts.update({"images": 0, "image_tokens": 0})
        self._ids: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []  # per example
        self._sizes: list[np.ndarray] = []  # examples per row
        self._rows = 0
        self.seconds = 0.0  # spent encoding, digesting and writing shards

    def add(
        self,
        ids: np.ndarray,
        labels: np.ndarray,
        lengths: np.ndarray,
        truncated: np.ndarray,
        sizes: np.ndarray | None = None,
        images: Sequence[ExampleImages] = (),
    ) -> None:
        """Append rows: flat ids and labels, one length per example, how many consecutive examples make each row
        (`sizes`; None: one each, the only choice for an unpacked writer), and each example's images (a writer of
        `images`)."""
        if not len(lengths):
            return
        if self.images:
            assert len(images) == len(lengths), "one entry of images per example"
            self._images.extend(images)
            self.counts["images"] += sum(len(names) for names, _ in images)
            self.counts["image_tokens"] += sum(sum(tokens) for _, tokens in images)
        if sizes is None:
            sizes = np.ones(len(lengths), dtype=np.int64)
        assert self.packed or bool((sizes == 1).all()), "an unpacked split holds one example per row"
        self._ids.append(ids)
        self._labels.append(labels)
        self._lengths.append(lengths)
        self._sizes.append(sizes)
        self._rows += len(sizes)
        self.counts["rows"] += len(sizes)
        starts = np.concatenate(([0], np.cumsum(lengths[:-1], dtype=np.int64)))
        targets = labels != IGNORE_INDEX
        # Predicted positions: labels after the shift, so an example's first label never counts.
        self.counts["target_tokens"] += int(targets.sum()) - int(targets[starts].sum())
        self.counts["records"] += len(lengths)
        self.counts["tokens"] += int(lengths.sum())
        self.counts["truncated"] += int(truncated.sum())
        while self._rows >= self.shard_rows:
            self._flush(self.shard_rows)

    def close(self) -> list[FileEntry]:
        """Write what is left; returns the entries of every shard written."""
        if self._rows:
            self._flush(self._rows)
        return self.files

    def _flush(self, rows: int) -> None:
        ids, labels, lengths, sizes = (
            np.concatenate(parts) for parts in (self._ids, self._labels, self._lengths, self._sizes)
        )
        examples = int(sizes[:rows].sum())
        tokens = int(lengths[:examples].sum())
        pictures, self._images = self._images[:examples], self._images[examples:]
        self._write(ids[:tokens], labels[:tokens], lengths[:examples], sizes[:rows], pictures)
        rest = rows < len(sizes)
        self._ids, self._labels, self._lengths, self._sizes = (
            ([ids[tokens:]], [labels[tokens:]], [lengths[examples:]], [sizes[rows:]]) if rest else ([], [], [], [])
        )
        self._rows = len(sizes) - rows

    def _write(
        self, ids: np.ndarray, labels: np.ndarray, lengths: np.ndarray, sizes: np.ndarray, pictures: list[ExampleImages]
    ) -> None:
        started = time.monotonic()
        example_ends = np.cumsum(lengths, dtype=np.int64)
        row_ends = np.cumsum(sizes, dtype=np.int64)
        offsets = pa.array(np.concatenate(([0], example_ends[row_ends - 1])).astype(np.int32))
        columns = [
            pa.ListArray.from_arrays(offsets, pa.array(ids, type=pa.int32())),
            pa.ListArray.from_arrays(offsets, pa.array(labels, type=pa.int32())),
            pa.array(np.diff(offsets.to_numpy()).astype(np.int32)),
        ]
        if self.preference:
            segment_offsets = pa.array(np.arange(0, 3 * len(sizes) + 1, 3, dtype=np.int32))
            columns.append(pa.ListArray.from_arrays(segment_offsets, pa.array(lengths.astype(np.int32))))
            columns.append(pa.array(self._pending_feedback[: len(sizes)], type=pa.int8()))
            self._pending_feedback = self._pending_feedback[len(sizes) :]
        elif self.packed:
            segment_offsets = pa.array(np.concatenate(([0], row_ends)).astype(np.int32))
            columns.append(pa.ListArray.from_arrays(segment_offsets, pa.array(lengths.astype(np.int32))))
        if self.images:
            columns += image_columns(pictures, row_ends)
        if self.schema is PROMPT_SHARD_SCHEMA:
            columns.append(pa.array(self._pending_records[: len(sizes)], type=pa.large_string()))
            self._pending_records = self._pending_records[len(sizes) :]
        data = encode_shard(pa.RecordBatch.from_arrays(columns, schema=self.schema))
        relpath = layout.shard_name(self.split, len(self.files))
        write_bytes_atomic(join(self.base, relpath), data)
        entry = {"path": relpath, "size": len(data), "digest": digest_bytes(data, self.algorithm)}
        self.files.append(entry)
        self.seconds += time.monotonic() - started
        self.on_write(entry)

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of this writer's shards."""
        if self.preference:
            return PREFERENCE_SHARD_SCHEMA
        schema = PACKED_SHARD_SCHEMA if self.packed else SHARD_SCHEMA
        for column in IMAGE_COLUMNS if self.images else []:
            schema = schema.append(column)
        return schema


def image_columns(pictures: list[ExampleImages], row_ends: np.ndarray) -> list[pa.Array]:
    """The `images` and `image_tokens` columns of rows whose examples end at `row_ends` (each row's examples' images,
    in order)."""
    starts = np.concatenate(([0], row_ends[:-1]))
    names = [[n for names, _ in pictures[a:b] for n in names] for a, b in zip(starts, row_ends, strict=True)]
    tokens = [[t for _, counts in pictures[a:b] for t in counts] for a, b in zip(starts, row_ends, strict=True)]
    return [pa.array(names, type=pa.list_(pa.string())), pa.array(tokens, type=pa.list_(pa.int32()))]


class PreferenceWriter(SplitWriter):
    """A split's preference rows (one pair or one KTO record a row) as shards: each row's three segments are
    written as its `segments`, its label as `feedback`; counts add the pairs and the desirable and undesirable
    answers."""

    def __init__(
        self, base: Location, split: str, shard_rows: int, algorithm: str, on_write: Callable[[FileEntry], None]
    ) -> None:
        super().__init__(base, split, shard_rows, algorithm, on_write, packed=True)
        self.preference = True
        self.counts.update({"pairs": 0, "desirable": 0, "undesirable": 0})

    def add_rows(
        self, ids: np.ndarray, labels: np.ndarray, segments: np.ndarray, feedback: np.ndarray, truncated: np.ndarray
    ) -> None:
        """Append rows: flat ids and labels, each row's three segment lengths (rows x 3) and its feedback."""
        if not len(feedback):
            return
        self._pending_feedback = np.concatenate((self._pending_feedback, feedback.astype(np.int8)))
        self.counts["pairs"] += int((feedback == PAIR).sum())
        self.counts["desirable"] += int((feedback == 1).sum())
        self.counts["undesirable"] += int((feedback == 0).sum())
        rows = len(feedback)
        self._ids.append(ids)
        self._labels.append(labels)
        self._lengths.append(segments.reshape(-1).astype(np.int64))
        self._sizes.append(np.full(rows, 3, dtype=np.int64))
        self._rows += rows
        for key, value in (("rows", rows), ("records", rows), ("tokens", int(segments.sum()))):
            self.counts[key] += value
        self.counts["truncated"] += int(truncated.sum())
        # Every answer token is predicted, the first one from its sequence's last prompt token.
        self.counts["target_tokens"] += int((labels != IGNORE_INDEX).sum())
        while self._rows >= self.shard_rows:
            self._flush(self.shard_rows)


class PromptWriter(SplitWriter):
    """A split's prompt rows (online RL: one prompt a row, with its record) as shards; counts add the prompts."""

    def __init__(
        self, base: Location, split: str, shard_rows: int, algorithm: str, on_write: Callable[[FileEntry], None]
    ) -> None:
        super().__init__(base, split, shard_rows, algorithm, on_write)
        self.counts["prompts"] = 0

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of prompt shards."""
        return PROMPT_SHARD_SCHEMA

    def add_prompts(self, ids: np.ndarray, lengths: np.ndarray, truncated: np.ndarray, records: list[str]) -> None:
        """Append prompt rows: flat ids, one length and one record (JSON) per prompt."""
        if not len(lengths):
            return
        self._pending_records.extend(records)
        self.counts["prompts"] += len(lengths)
        self.add(ids, np.full(len(ids), IGNORE_INDEX, dtype=np.int32), lengths, truncated)


def encode_shard(batch: pa.RecordBatch) -> bytes:
    """A shard's bytes: the rows as one record batch of an uncompressed Arrow IPC file (mapped, never decoded)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def examples_of(rows: Iterable[Row], image_token: int = -1) -> list[Row]:
    """Each example of the rows as a row of its own, in order (a packed row cut at its boundaries); a row's images go
    to the examples whose tokens hold them (`image_token`: the id of a vision-language model's `<|image_pad|>`, one
    run of them per image)."""
    out: list[Row] = []
    for packed in rows:
        start, images = 0, iter(zip(packed.images, packed.image_tokens, strict=True))
        for length in packed.segments:
            ids = packed.input_ids[start : start + length]
            example = row(ids, packed.labels[start : start + length])
            if packed.images:
                own = [next(images) for _ in range(image_runs(ids, image_token))]
                example = example._replace(images=[n for n, _ in own], image_tokens=[t for _, t in own])
            out.append(example)
            start += length
    return out


def image_runs(ids: Sequence[int], image_token: int) -> int:
    """Runs of `image_token` in `ids`: the images whose tokens they hold."""
    return sum(1 for i, token in enumerate(ids) if token == image_token and (i == 0 or ids[i - 1] != image_token))
