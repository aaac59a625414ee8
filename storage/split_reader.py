"""A split of a staged dataset, read row by row from its memory-mapped shards (Arrow IPC files, storage/shards.py).

Opening a split maps each shard and checks its structure (one record batch, the columns, offsets within bounds);
nothing else is read. A row is taken by its offsets when it is asked for: the pages it touches come from the page
cache (file-backed memory, shared by every rank of a node and given back under pressure), so a rank's own memory
holds the index (a handful of array views per shard) and the rows of the step it trains on, whatever the size of the
dataset. Which local files a node reads (in place, or its node cache's copy) is storage/local_dataset.py's concern.
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import numpy as np
import pyarrow as pa

from storage.shards import Row

COLUMNS = ("input_ids", "labels", "length")


@dataclass(frozen=True)
class ImageSource:
    """Where a split's images are read on this node (the dataset's `images/` in place, or the node cache copy's)
    and the pixel settings they were staged with (the manifest's `images`: data.image_min_pixels and
    data.image_max_pixels)."""

    folder: Path
    min_pixels: int
    max_pixels: int
    sources: dict[str, str] = field(default_factory=dict)  # each image's name: where it was staged from

    def label(self, name: str) -> str:
        """What a person knows an image by: its file name where it was staged from (else its staged name)."""
        return self.sources.get(name, name).rsplit("/", 1)[-1]


class ShardError(ValueError):
    """A shard that cannot be read (truncated, not an Arrow file, or not of this layout); the message says why."""


class Shard:
    """One memory-mapped shard: views of its columns, nothing copied."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        try:
            self._map = pa.memory_map(self.path, "r")
            reader = pa.ipc.open_file(self._map)
            if reader.num_record_batches != 1:
                raise ShardError(f"{reader.num_record_batches} record batches, one expected")
            batch = reader.get_batch(0)
            batch.validate(full=True)  # offsets within bounds: a damaged file fails here, not in a step
        except (pa.ArrowException, OSError) as exc:
            raise ShardError(str(exc).splitlines()[0]) from None
        if tuple(batch.schema.names[:3]) != COLUMNS:
            raise ShardError(f"columns {batch.schema.names}, expected {list(COLUMNS)} first")
        ids, labels = batch.column(0), batch.column(1)
        self.offsets = ids.offsets.to_numpy()
        if not np.array_equal(self.offsets, labels.offsets.to_numpy()):
            raise ShardError("input_ids and labels differ in length")
        self.ids, self.labels = ids.values.to_numpy(), labels.values.to_numpy()
        self.lengths = batch.column(2).to_numpy()
        self.segment_offsets: np.ndarray | None = None
        self.segments: np.ndarray | None = None
        if "segments" in batch.schema.names:
            segments = batch.column(batch.schema.names.index("segments"))
            self.segment_offsets, self.segments = segments.offsets.to_numpy(), segments.values.to_numpy()
        # Preference rows (storage/shards.py): -1 a pair, else a KTO label; None: supervised rows.
        self.feedback: np.ndarray | None = None
        if "feedback" in batch.schema.names:
            self.feedback = batch.column(batch.schema.names.index("feedback")).to_numpy()
        # A dataset with images: each row's image names and tokens (small: decoded whole, as Python lists).
        self.images: list[list[str]] | None = None
        self.image_tokens: list[list[int]] | None = None
        if "images" in batch.schema.names:
            self.images = batch.column(batch.schema.names.index("images")).to_pylist()
            self.image_tokens = batch.column(batch.schema.names.index("image_tokens")).to_pylist()
        # Prompt rows (online RL): each row's record, as JSON (storage/shards.py); None: other rows.
        self.records: pa.Array | None = None
        if "record" in batch.schema.names:
            self.records = batch.column(batch.schema.names.index("record"))
        self.rows = batch.num_rows

    def row(self, index: int) -> Row:
        """Row `index` of this shard, copied out of the map (lists: what collate and the tests take)."""
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        if self.segments is None or self.segment_offsets is None:
            segments = [end - start]
        else:
            segments = self.segments[self.segment_offsets[index] : self.segment_offsets[index + 1]].tolist()
        ids, labels = self.ids[start:end].tolist(), self.labels[start:end].tolist()
        if self.images is None or self.image_tokens is None:
            return Row(ids, labels, segments)
        return Row(ids, labels, segments, self.images[index], self.image_tokens[index])


class Split(Sequence[Row]):
    """The rows of one split in manifest order, over its shards; `examples` counts the examples (records) in them."""

    def __init__(self, shards: list[Shard], examples: int) -> None:
        self.shards = shards
        self.examples = examples
        self.lease: object | None = None  # a node cache copy's hold (storage/node_cache.py Lease), kept while read
        self.images: ImageSource | None = None  # where its rows' images are read (a dataset with images)
        self._starts = list(itertools.accumulate((shard.rows for shard in shards), initial=0))

    def close(self) -> None:
        """Let the node cache copy go now (a rank's splits otherwise hold it until they are collected)."""
        release = getattr(self.lease, "release", None)
        if release is not None:
            release()
        self.lease = None

    def __enter__(self) -> Split:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return self._starts[-1]

    @overload
    def __getitem__(self, index: int) -> Row: ...

    @overload
    def __getitem__(self, index: slice) -> list[Row]: ...

    def __getitem__(self, index: int | slice) -> Row | list[Row]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        shard, local = self._locate(index)
        return shard.row(local)

    def length(self, index: int) -> int:
        """Tokens of row `index`, read from the length column alone."""
        shard, local = self._locate(index)
        return int(shard.lengths[local])

    def feedback(self, index: int) -> int:
        """A preference row's `feedback` (-1: a pair; 1, 0: a KTO answer labelled desirable or not)."""
        shard, local = self._locate(index)
        if shard.feedback is None:
            raise ShardError(
                f"{shard.path}: not preference rows (no feedback column); stage with data.preference=pairs"
            )
        return int(shard.feedback[local])

    def record(self, index: int) -> dict[str, Any]:
        """A prompt row's record (its location, prompt messages and columns: staging/prompts.py)."""
        shard, local = self._locate(index)
        if shard.records is None:
            raise ShardError(f"{shard.path}: not prompt rows (no record column); stage with data.preference=prompts")
        doc: dict[str, Any] = json.loads(shard.records[local].as_py())
        return doc

    @property
    def prompts(self) -> bool:
        """Whether the split holds prompt rows (data.preference=prompts)."""
        return bool(self.shards) and self.shards[0].records is not None

    @property
    def preference(self) -> bool:
        """Whether the split holds preference rows (data.preference=pairs)."""
        return bool(self.shards) and self.shards[0].feedback is not None

    def _locate(self, index: int) -> tuple[Shard, int]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"row {index} of a split of {len(self)} rows")
        index %= len(self)
        position = bisect.bisect_right(self._starts, index) - 1
        return self.shards[position], index - self._starts[position]
