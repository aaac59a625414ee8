"""Preference rows into the sequences the model reads (trainer/objectives/preference/batching.py): a pair becomes
prompt + chosen and prompt + rejected, the n chosen first in one padded batch, targets on the answers alone; a KTO
answer is one sequence plus its mismatched one (its prompt, its partner's answer); a micro-batch mixing the two is
refused. Dealt from a real staged split over 2 ranks, every unit of the step is in exactly one micro-batch, and a KTO
row's partner is the next row of the step's global order however the rows are dealt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from storage.location import Location
from storage.shards import IGNORE_INDEX, PAIR, PreferenceWriter, Row
from storage.split_reader import Shard, Split
from trainer.data import Dealing, GlobalOrder
from trainer.objectives.preference.batching import collate_preference, parts, rank_preference_batches

PAD = 0


def pref_row(k: int, sizes: tuple[int, int, int]) -> Row:
    """Row k: prompt tokens 100k + i, chosen 1000 + 100k + i, rejected 2000 + 100k + i (no rejected: KTO)."""
    p, c, r = sizes
    prompt, chosen, rejected = ([base + 100 * k + i for i in range(n)] for base, n in ((0, p), (1000, c), (2000, r)))
    return Row(prompt + chosen + rejected, [IGNORE_INDEX] * p + chosen + rejected, [p, c, r])


def staged(tmp_path: Path, rows: list[Row], feedback: list[int]) -> Split:
    writer = PreferenceWriter(Location(str(tmp_path)), "train", 100, "blake3", lambda entry: None)
    for item, label in zip(rows, feedback, strict=True):
        writer.add_rows(
            np.array(item.input_ids),
            np.array(item.labels),
            np.array([item.segments]),
            np.array([label]),
            np.zeros(1, dtype=bool),
        )
    [entry] = writer.close()
    return Split([Shard(tmp_path / entry["path"])], len(rows))


def test_a_row_splits_into_its_prompt_and_answers() -> None:
    prompt, answers = parts(pref_row(1, (2, 3, 1)))
    assert prompt == [100, 101] and answers == [([1100, 1101, 1102],) * 2, ([2100],) * 2]
    prompt, answers = parts(pref_row(2, (1, 2, 0)))  # KTO: the third segment is empty
    assert prompt == [200] and answers == [([1200, 1201],) * 2]


def test_pairs_are_their_chosen_then_their_rejected_sequences() -> None:
    rows = [pref_row(0, (2, 3, 1)), pref_row(1, (1, 1, 4))]
    batch = collate_preference(rows, [PAIR, PAIR], PAD, indices=[7, 3])
    assert batch.pairs and batch.units == 2 and batch.mismatched is None and batch.indices == (7, 3)
    assert batch.desirable.tolist() == [True, True]
    ids, labels = batch.sequences.input_ids.tolist(), batch.sequences.labels.tolist()
    assert ids == [
        [0, 1, 1000, 1001, 1002],
        [100, 1100, 0, 0, 0],
        [0, 1, 2000, PAD, PAD],
        [100, 2100, 2101, 2102, 2103],
    ]
    assert labels[0] == [IGNORE_INDEX, IGNORE_INDEX, 1000, 1001, 1002]
    assert labels[2] == [IGNORE_INDEX, IGNORE_INDEX, 2000, IGNORE_INDEX, IGNORE_INDEX]
    assert batch.chosen_tokens == 3 + 1 and batch.padding == (3 + 2, 20)


def test_kto_answers_come_with_their_prompt_and_their_partners_answer() -> None:
    rows = [pref_row(0, (2, 2, 0)), pref_row(1, (1, 3, 0)), pref_row(2, (2, 1, 0))]
    batch = collate_preference(rows[:2], [1, 0], PAD, partners=[rows[1], rows[2]], indices=[0, 1])
    assert not batch.pairs and batch.units == 2 and batch.desirable.tolist() == [True, False]
    assert batch.sequences.input_ids.tolist() == [[0, 1, 1000, 1001], [100, 1100, 1101, 1102]]
    assert batch.mismatched is not None
    assert batch.mismatched.input_ids.tolist() == [[0, 1, 1100, 1101, 1102], [100, 1200, PAD, PAD, PAD]]
    assert batch.mismatched.labels.tolist()[1] == [IGNORE_INDEX, 1200] + [IGNORE_INDEX] * 3
    assert batch.chosen_tokens == 2  # the desirable answer's targets alone


def test_a_micro_batch_mixing_pairs_and_kto_answers_is_refused() -> None:
    with pytest.raises(ValueError, match="mixes pairs and KTO answers"):
        collate_preference([pref_row(0, (1, 1, 1)), pref_row(1, (1, 1, 0))], [PAIR, 1], PAD, [pref_row(2, (1, 1, 0))])


@pytest.mark.parametrize("group_by_length", [True, False])
def test_every_unit_of_a_step_is_dealt_once_with_its_partner_from_the_global_order(
    tmp_path: Path, group_by_length: bool
) -> None:
    sizes = [(1 + k % 3, 1 + (5 * k) % 4, 0) for k in range(16)]
    rows = [pref_row(k, size) for k, size in enumerate(sizes)]
    split, order = staged(tmp_path, rows, [k % 2 for k in range(16)]), GlobalOrder(16, seed=4)
    step, micro, accum, world = 1, 2, 2, 2  # the second 8 rows of the epoch
    expected = order.step_indices(step, micro * accum * world)
    partner = {index: expected[(k + 1) % len(expected)] for k, index in enumerate(expected)}
    seen: list[int] = []
    for rank in range(world):
        dealing = Dealing(step, micro, accum, rank, world, PAD, group_by_length)
        batches = list(rank_preference_batches(split, order, dealing))
        assert [b.units for b in batches] == [micro] * accum
        mine = [i for b in batches for i in b.indices]
        if not group_by_length:
            assert mine == expected[rank * micro * accum : (rank + 1) * micro * accum]
        for b in batches:
            assert b.mismatched is not None
            assert b.desirable.tolist() == [i % 2 == 1 for i in b.indices]
            for k, i in enumerate(b.indices):
                wanted = parts(rows[i])[0] + parts(rows[partner[i]])[1][0][0]  # its prompt, its partner's answer
                assert b.mismatched.input_ids[k, : len(wanted)].tolist() == wanted
        seen += mine
    assert sorted(seen) == sorted(expected)
