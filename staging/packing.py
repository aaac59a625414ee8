"""Sequence packing (`data.packing`): a split's examples packed into rows of at most `data.max_length` tokens.

First-fit decreasing: examples are taken longest first (ties: the earlier record first) and each goes to the
first row it still fits in. The rows therefore depend only on the examples' lengths and order, both fixed by
the dataset id (records, tokenizer, max_length), never on the number of processes or on timing. Each row
keeps its examples' lengths (the shards' `segments` column): the trainer and the evaluation restart positions
at every boundary and never let an example attend across one (trainer/data.py).

A split's tokenized examples are spooled to local files while the tokenizer streams them, so memory holds
lengths and row assignments, not tokens; the rows are written once every example is known.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from config.sections.run_data import DataConfig
from storage.location import Location
from storage.shards import ExampleImages, FileEntry, PreferenceWriter, PromptWriter, SplitWriter

TEXT_FORMAT = "text"  # plain text: packed unless data.packing says otherwise


def packing_enabled(data: DataConfig, formats: Iterable[str]) -> bool:
    """data.packing when set; unset: on when every input resolved to the plain-text format, off for chat.
    `formats`: the resolved format of each file that gave records (from data.format, data.sources[i].format, a
    dataset_info.json entry, or detected from the file's first records)."""
    if data.packing is not None:
        return data.packing
    if data.preference_mode in ("pairs", "prompts"):  # a pair, a prompt is one row: never packed
        return False
    found = set(formats)
    return found == {TEXT_FORMAT}


def first_fit_decreasing(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Example indices per row, rows in the order they were opened, each row's examples longest first.

    A max segment tree over the room left in every row (rows not yet opened have all of it) finds the first
    row an example fits in with one walk from the root: O(log n) per example instead of a scan of the rows.
    """
    count = len(lengths)
    if not count:
        return []
    assert int(lengths.max()) <= capacity, "an example longer than a row: truncation should have cut it"
    order = np.lexsort((np.arange(count), -lengths.astype(np.int64))).tolist()
    size = 1 << max(0, (count - 1).bit_length())
    room = [capacity] * (2 * size)
    rows: list[list[int]] = []
    need_of = lengths.tolist()
    for index in order:
        need, node = need_of[index], 1
        while node < size:  # descend to the leftmost row with room >= need
            node = 2 * node if room[2 * node] >= need else 2 * node + 1
        slot = node - size
        if slot == len(rows):
            rows.append([])
        rows[slot].append(index)
        room[node] -= need
        node //= 2
        while node:
            best = max(room[2 * node], room[2 * node + 1])
            if room[node] == best:
                break
            room[node] = best
            node //= 2
    return rows


class PackingWriter:
    """Takes a split's examples as SplitWriter does, packs them when closed, and hands the rows to it."""

    def __init__(self, writer: SplitWriter, capacity: int, workdir: Path) -> None:
        self.writer, self.capacity = writer, capacity
        self._ids_path, self._labels_path = workdir / f"{writer.split}.ids", workdir / f"{writer.split}.labels"
        self._ids, self._labels = open(self._ids_path, "wb"), open(self._labels_path, "wb")  # noqa: SIM115
        self._lengths: list[np.ndarray] = []
        self._truncated: list[np.ndarray] = []
        self._images: list[ExampleImages] = []  # per example, in a dataset with images

    @property
    def counts(self) -> dict[str, int]:
        """The split's counts (complete once closed)."""
        return self.writer.counts

    @property
    def images(self) -> bool:
        """Whether its rows name images."""
        return self.writer.images

    @property
    def seconds(self) -> float:
        """Time spent writing shards."""
        return self.writer.seconds

    def add(
        self,
        ids: np.ndarray,
        labels: np.ndarray,
        lengths: np.ndarray,
        truncated: np.ndarray,
        images: Sequence[ExampleImages] = (),
    ) -> None:
        """Spool examples (flat ids and labels, one length per example, and each one's images: their names are
        small, so they stay in memory)."""
        self._images.extend(images)
        ids.astype(np.int32, copy=False).tofile(self._ids)
        labels.astype(np.int32, copy=False).tofile(self._labels)
        self._lengths.append(np.asarray(lengths, dtype=np.int64))
        self._truncated.append(np.asarray(truncated))

    def close(self) -> list[FileEntry]:
        """Pack every spooled example, write the rows, shard by shard; returns the shards' entries."""
        self._ids.close()
        self._labels.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, dtype=np.int64)
        truncated = np.concatenate(self._truncated) if self._truncated else np.zeros(0, dtype=bool)
        if len(lengths):
            starts = np.cumsum(lengths) - lengths
            ids = np.memmap(self._ids_path, dtype=np.int32, mode="r")
            labels = np.memmap(self._labels_path, dtype=np.int32, mode="r")
            rows = first_fit_decreasing(lengths, self.capacity)
            for first in range(0, len(rows), self.writer.shard_rows):
                batch = rows[first : first + self.writer.shard_rows]
                chosen = np.fromiter((i for r in batch for i in r), dtype=np.int64)
                sizes = np.fromiter((len(r) for r in batch), dtype=np.int64, count=len(batch))
                took = lengths[chosen]
                # Source position of every output token: each chosen example's tokens, one after the other.
                source = np.repeat(starts[chosen] - (np.cumsum(took) - took), took) + np.arange(int(took.sum()))
                pictures = [self._images[i] for i in chosen] if self.writer.images else []
                self.writer.add(ids[source], labels[source], took, truncated[chosen], sizes, pictures)
            del ids, labels  # the memory maps, before their files go
        self._ids_path.unlink()
        self._labels_path.unlink()
        return self.writer.close()


def split_writer(
    base: Location,
    split: str,
    data: DataConfig,
    on_write: Callable[[FileEntry], None],
    packed: bool,
    workdir: Path,
    images: bool = False,
) -> SplitWriter | PackingWriter:
    """The writer of one split's shards: examples row by row (with their images' names and tokens when the records
    have any), spooled and packed into rows of max_length, preference rows (data.preference=pairs) or prompt rows
    (data.preference=prompts)."""
    if data.preference_mode == "pairs":
        return PreferenceWriter(base, split, data.shard_rows, data.digest_algorithm, on_write)
    if data.preference_mode == "prompts":
        return PromptWriter(base, split, data.shard_rows, data.digest_algorithm, on_write)
    writer = SplitWriter(base, split, data.shard_rows, data.digest_algorithm, on_write, packed=packed, images=images)
    return PackingWriter(writer, data.max_length, workdir) if packed else writer
