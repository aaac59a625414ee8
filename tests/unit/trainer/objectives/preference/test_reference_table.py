"""Full fine-tuning's reference table (trainer/objectives/preference/reference_table.py) in one process: rows gathered
in fixed-size blocks land in their places, whatever the order and the block size; the table is written under a temporary
name and renamed (a failed fill leaves nothing under the name), then mapped read-only, not read into memory; a table on
an object store (a real S3 endpoint, moto's) is fetched once per node into the node cache and mapped there, and a table
written again is fetched again; a table of other rows, or a file that is no table, stops in one line naming it. The
model's log-probabilities are those of a forward pass one row at a time. Three real ranks (processes in a gloo group)
with uneven shares and blocks of a few rows each build the same table and map it; the whole training path over several
ranks is tests/distributed/test_preference.py's, through real torchrun."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from core.errors import UserError
from launch.command import free_port
from storage.fs import filesystem, write_bytes_atomic
from storage.location import Location
from storage.node_cache import REFERENCE
from storage.shards import PAIR, Row
from trainer.loss.chunked import LossHead
from trainer.loss.logps import sequence_logps
from trainer.model import tiny
from trainer.objectives.preference import reference_table
from trainer.objectives.preference.batching import collate_preference
from trainer.objectives.preference.reference_table import (
    collect,
    compute,
    load,
    pass_count,
    table_url,
    write,
    written_table,
)
from trainer.parallel.distributed import Dist, barrier, init, shutdown

ONE = Dist(rank=0, local_rank=0, world_size=1, node_rank=0, host="test", device=torch.device("cpu"))


def values_of(rows: int) -> np.ndarray:
    """Distinct values for every cell of a table of `rows` rows."""
    return -np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) - 0.25


def parts_of(values: np.ndarray, per_pass: int, order: list[int] | None = None) -> list[tuple[list[int], np.ndarray]]:
    """A rank's passes over `values`: `per_pass` rows each (fewer in the last), rows in `order`, some passes empty."""
    order = list(range(len(values))) if order is None else order
    parts: list[tuple[list[int], np.ndarray]] = [([], np.empty((0, 2)))]
    for start in range(0, len(order), per_pass):
        group = order[start : start + per_pass]
        parts += [(group, values[group]), ([], np.empty((0, 2)))]
    return parts


def fill_with(values: np.ndarray, per_pass: int = 3) -> Callable[[np.ndarray | None], None]:
    """A table's fill: `values` sent in passes of `per_pass` rows, as one rank sends its rows."""

    def fill(out: np.ndarray | None) -> None:
        assert collect(parts_of(values, per_pass), out, ONE, rows_per_pass=per_pass) == len(values)

    return fill


@pytest.mark.parametrize("gather_rows", [1, 7, 1 << 16])
def test_blocks_of_any_size_put_every_row_in_its_place(monkeypatch: pytest.MonkeyPatch, gather_rows: int) -> None:
    monkeypatch.setattr(reference_table, "GATHER_ROWS", gather_rows)
    values = values_of(101)
    order = list(np.random.default_rng(0).permutation(101))
    out = np.zeros((101, 2))
    assert collect(parts_of(values, 4, order), out, ONE, rows_per_pass=4) == 101
    np.testing.assert_array_equal(out, values)


def test_a_table_is_renamed_into_place_then_mapped(tmp_path: Path) -> None:
    run, values = Location(str(tmp_path / "run")), values_of(50)
    write(run, "train", 50, ONE, tmp_path / "cache", fill_with(values))
    reference = tmp_path / "run" / "reference"
    assert [p.name for p in reference.iterdir()] == ["train.npy"]
    np.testing.assert_array_equal(np.load(reference / "train.npy"), values)
    table = load(run, "train", 50, tmp_path / "cache")
    assert table is not None and isinstance(table.values, np.memmap) and not table.values.flags.writeable
    got = table.logps((7, 2, 7), torch.device("cpu"))
    assert got.tolist() == [values[7, 0], values[2, 0], values[7, 0], values[7, 1], values[2, 1], values[7, 1]]
    assert load(run, "eval", 50, tmp_path / "cache") is None


def test_a_failed_fill_leaves_nothing_under_any_name(tmp_path: Path) -> None:
    run = Location(str(tmp_path / "run"))

    def fail(out: np.ndarray | None) -> None:
        raise RuntimeError("the forward pass failed")

    with pytest.raises(RuntimeError, match="forward pass failed"):
        write(run, "train", 10, ONE, tmp_path / "cache", fail)
    assert list((tmp_path / "run" / "reference").iterdir()) == []


def test_other_rows_or_no_table_stop_in_one_line(tmp_path: Path) -> None:
    run = Location(str(tmp_path / "run"))
    write(run, "train", 5, ONE, tmp_path / "cache", fill_with(values_of(5)))
    with pytest.raises(UserError, match=r"reference/train.npy: 5 rows .* the train split has 6; .* delete it") as err:
        load(run, "train", 6, tmp_path / "cache")
    assert "\n" not in str(err.value)
    write_bytes_atomic(table_url(run, "train"), b"not a table")
    with pytest.raises(UserError, match=r"reference/train.npy: not a readable reference table .*; delete it") as err:
        load(run, "train", 5, tmp_path / "cache")
    assert "\n" not in str(err.value)
    np.save(tmp_path / "run" / "reference" / "train.npy", values_of(5).astype(np.float32))
    with pytest.raises(UserError, match=r"float32 of shape \(5, 2\), not rows x 2 float64"):
        load(run, "train", 5, tmp_path / "cache")


def test_a_table_on_an_object_store_is_fetched_once_per_node_and_mapped(s3_bucket: Location, tmp_path: Path) -> None:
    run, values = s3_bucket, values_of(40)
    write(run, "train", 40, ONE, tmp_path / "writer", fill_with(values))
    kept = list((tmp_path / "writer" / REFERENCE).glob("*.npy"))
    assert len(kept) == 1, "rank 0's node keeps what it uploaded as its copy"
    node = tmp_path / "node"
    table = load(run, "train", 40, node)
    assert table is not None and isinstance(table.values, np.memmap)
    np.testing.assert_array_equal(table.values, values)
    (copy,) = (node / REFERENCE).glob("*.npy")
    assert copy.name == kept[0].name and not list((node / REFERENCE).glob(".tmp-*"))
    inode = copy.stat().st_ino
    assert load(run, "train", 40, node) is not None and copy.stat().st_ino == inode, "fetched once"
    write(run, "train", 40, ONE, tmp_path / "writer", fill_with(values + 1))
    again = load(run, "train", 40, node)
    assert again is not None and len(list((node / REFERENCE).glob("*.npy"))) == 2
    np.testing.assert_array_equal(again.values, values + 1)
    np.testing.assert_array_equal(table.values, values)  # a rank that mapped the old table still reads it whole
    fs, path = filesystem(table_url(run, "train"))
    fs.rm(path)
    assert load(run, "train", 40, node) is None


def test_the_base_models_log_probabilities_fill_the_table() -> None:
    """compute() on one rank: each row's summed log-probabilities of its two answers, as one pass over that row alone
    gives them from full logits, in micro-batches of 3 (the last short), taken in chunks of the last hidden states."""
    model = tiny.build_model(tiny.RECIPE["vocab_size"], pad_id=0, eos_id=1).eval()
    generator = torch.Generator().manual_seed(1)
    rows = Rows()
    for _ in range(7):
        p, c, r = (int(torch.randint(3, 9, (1,), generator=generator)) for _ in range(3))
        ids = torch.randint(2, tiny.RECIPE["vocab_size"], (p + c + r,), generator=generator).tolist()
        rows.append(Row(ids, [-100] * p + ids[p:], [p, c, r]))
    out = np.zeros((7, 2))
    head = LossHead.of(model, 8, one_pass_max_bytes=0)  # in chunks, against full logits below
    compute(model, rows, ONE, out, batch_size=3, pad_id=0, lockstep=False, head=head)
    for i, row in enumerate(rows):
        batch = collate_preference([row], [PAIR], 0).sequences
        with torch.no_grad():
            expected, _ = sequence_logps(model(**batch.model_inputs(torch.device("cpu"))).logits, batch.labels)
        np.testing.assert_allclose(out[i], expected.double().numpy(), rtol=1e-5)


class Rows(list[Row]):
    """Pairs as reference_table.py reads a split: rows by index, each one's feedback."""

    def feedback(self, index: int) -> int:
        return PAIR


def ranks_build(rank: int, world: int, port: int, folder: str, rows: int) -> None:
    """One rank of test_ranks_gather_their_shares_into_one_mapped_table: its share sent in passes of 4 rows, blocks
    of 8 rows in all ranks together, and the written table checked."""
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    reference_table.GATHER_ROWS = 8
    dist = init(deepspeed_backend=False, timeout_s=60)
    values, mine = values_of(rows), range(rank, rows, world)
    parts = [(mine[k * 4 : (k + 1) * 4], values[mine[k * 4 : (k + 1) * 4]]) for k in range(pass_count(rows, world, 4))]
    run, cache = Location(os.path.join(folder, "run")), Path(folder) / "cache"
    write(run, "train", rows, dist, cache, lambda out: collect(parts, out, dist, rows_per_pass=4))
    barrier()
    table = written_table(run, "train", rows, cache)
    assert isinstance(table.values, np.memmap)
    np.testing.assert_array_equal(table.values, values)
    Path(folder, f"rank-{rank}.ok").touch()
    shutdown()


def test_ranks_gather_their_shares_into_one_mapped_table(tmp_path: Path) -> None:
    mp.spawn(ranks_build, args=(3, free_port(), str(tmp_path), 101), nprocs=3, join=True)
    assert sorted(p.name for p in tmp_path.glob("rank-*.ok")) == ["rank-0.ok", "rank-1.ok", "rank-2.ok"]
    assert [p.name for p in (tmp_path / "run" / "reference").iterdir()] == ["train.npy"]
