"""Preference rows (storage/shards.py) -> the sequences the model reads, one forward pass per micro-batch.

A pair's row holds its prompt once and both answers; here it becomes two sequences, prompt + chosen and prompt +
rejected, and a micro-batch of n pairs is one padded batch of 2n sequences (the n chosen first), so the chosen and
the rejected answers go through the same forward pass. A KTO row holds a prompt and one answer: one sequence, plus
for the KL reference point a mismatched one, its prompt with the answer of its partner, the row after it in the
step's global order (so a row's partner depends on the step alone, not on how rows are dealt to ranks).

A pair, or a KTO answer, is one unit of the global batch: rows are ordered, dealt and counted as supervised rows are
(trainer/data.py), and each unit's loss is divided by the global batch's count (trainer/objectives/preference/).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from storage.shards import IGNORE_INDEX, PAIR, Row, row
from storage.split_reader import Split
from trainer.data import Batch, Dealing, GlobalOrder, collate


@dataclass(frozen=True)
class PreferenceBatch:
    """A micro-batch of preference units: `sequences` (pairs: the chosen then the rejected sequences; feedback:
    one sequence each), the label of each KTO answer, and the KL sequences (KTO only)."""

    sequences: Batch
    pairs: bool
    desirable: torch.Tensor  # bool per unit (pairs: all true)
    mismatched: Batch | None = None
    indices: tuple[int, ...] = ()  # each unit's row in its split (a precomputed reference is looked up by it)

    @property
    def units(self) -> int:
        """Pairs or KTO answers in it."""
        return len(self.desirable)

    @property
    def padding(self) -> tuple[int, int]:
        """(pad positions, all positions) of its sequences (the mismatched ones are KTO's reference point's)."""
        return self.sequences.padding

    @property
    def chosen_tokens(self) -> int:
        """Target positions of the chosen (or desirable) answers: ORPO's cross-entropy is over them."""
        labels = self.sequences.labels[: self.units, 1:]
        return int(((labels != IGNORE_INDEX) & self.desirable[:, None]).sum())


def parts(item: Row) -> tuple[list[int], list[tuple[list[int], list[int]]]]:
    """(prompt ids, [(ids, labels) of each answer]) of a preference row (a KTO row's third segment is empty)."""
    prompt, *answers = item.segments
    ids, labels = list(item.input_ids), list(item.labels)
    out, start = [], prompt
    for size in answers[: 2 if answers[1] else 1]:
        out.append((ids[start : start + size], labels[start : start + size]))
        start += size
    return ids[:prompt], out


def sequence(prompt: list[int], answer: tuple[list[int], list[int]]) -> Row:
    """The prompt followed by an answer, targets on the answer only."""
    return row(prompt + answer[0], [IGNORE_INDEX] * len(prompt) + answer[1])


def collate_preference(
    items: Sequence[Row],
    feedback: Sequence[int],
    pad_id: int,
    partners: Sequence[Row] = (),
    indices: Sequence[int] = (),
) -> PreferenceBatch:
    """One micro-batch of preference rows (`feedback`: each row's; `partners`: each KTO row's partner row;
    `indices`: each row's index in its split)."""
    split = [parts(item) for item in items]
    if all(f == PAIR for f in feedback):
        chosen = [sequence(prompt, answers[0]) for prompt, answers in split]
        rejected = [sequence(prompt, answers[1]) for prompt, answers in split]
        return PreferenceBatch(
            collate(chosen + rejected, pad_id), True, torch.ones(len(items), dtype=torch.bool), indices=tuple(indices)
        )
    if any(f == PAIR for f in feedback):
        raise ValueError("a micro-batch mixes pairs and KTO answers; a dataset holds one or the other")
    mismatched = [sequence(prompt, parts(other)[1][0]) for (prompt, _), other in zip(split, partners, strict=True)]
    return PreferenceBatch(
        collate([sequence(prompt, answers[0]) for prompt, answers in split], pad_id),
        False,
        torch.tensor([f == 1 for f in feedback], dtype=torch.bool),
        collate(mismatched, pad_id),
        tuple(indices),
    )


def rank_preference_batches(rows: Split, order: GlobalOrder, dealing: Dealing) -> Iterator[PreferenceBatch]:
    """This rank's micro-batches of preference units for the step `dealing` names, chosen and dealt as
    trainer/data.py deals supervised rows; a KTO row's partner is the next row of the step's global order."""
    indices, mine = dealing.groups(rows, order)
    partner = {index: indices[(position + 1) % len(indices)] for position, index in enumerate(indices)}
    for group in mine:
        feedback = [rows.feedback(i) for i in group]
        partners = [rows[partner[i]] for i in group] if PAIR not in feedback else []
        yield collate_preference([rows[i] for i in group], feedback, dealing.pad_id, partners, group)
