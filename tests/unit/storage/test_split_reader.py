"""A split read row by row from its memory-mapped shards: rows in manifest order across shards, lengths from their
column alone, and a damaged or foreign file refused with the reason before any step reads it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from storage.location import Location
from storage.node_cache import Lease, unused
from storage.shards import SplitWriter
from storage.split_reader import Shard, ShardError, Split


def shards(folder, rows: int, shard_rows: int) -> list[Shard]:
    writer = SplitWriter(Location(str(folder)), "train", shard_rows, "blake3", lambda _: None)
    lengths = np.arange(1, rows + 1, dtype=np.int64)  # row i holds i+1 tokens, all of value i
    ids = np.repeat(np.arange(rows, dtype=np.int32), lengths)
    writer.add(ids, ids.copy(), lengths, np.zeros(rows, dtype=bool))
    return [Shard(folder / entry["path"]) for entry in writer.close()]


def test_rows_are_read_in_order_across_shards(tmp_path) -> None:
    with Split(shards(tmp_path, 7, 3), 7) as split:
        assert len(split) == 7 and len(split.shards) == 3 and not split.preference
        assert [split[i].input_ids for i in range(7)] == [[i] * (i + 1) for i in range(7)]
        assert split[-1] == split[6] and [r.input_ids[0] for r in split[2:5]] == [2, 3, 4]
        assert [split.length(i) for i in range(7)] == list(range(1, 8))
        with pytest.raises(IndexError, match="row 7 of a split of 7 rows"):
            split[7]
        with pytest.raises(ShardError, match=r"not preference rows \(no feedback column\); stage with"):
            split.feedback(0)


def test_a_damaged_or_foreign_shard_is_refused_with_the_reason(tmp_path) -> None:
    [shard] = shards(tmp_path, 4, 10)
    data = Path(shard.path).read_bytes()
    truncated = tmp_path / "truncated.arrow"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ShardError):
        Shard(truncated)
    (tmp_path / "text.arrow").write_text("not arrow at all")
    with pytest.raises(ShardError):
        Shard(tmp_path / "text.arrow")
    other = tmp_path / "other.arrow"
    table = pa.table({"tokens": pa.array([[1, 2]], type=pa.list_(pa.int32()))})
    with pa.OSFile(str(other), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(ShardError, match=r"columns \['tokens'\], expected \['input_ids', 'labels', 'length'\] first"):
        Shard(other)


def test_closing_the_split_lets_its_node_cache_copy_go(tmp_path) -> None:
    entry = tmp_path / "cache" / "datasets" / "d-0123"
    split = Split(shards(tmp_path, 2, 10), 2)
    split.lease = Lease(entry)  # as open_split holds the copy it reads
    with unused(entry) as free:
        assert not free
    split.close()
    with unused(entry) as free:
        assert free
