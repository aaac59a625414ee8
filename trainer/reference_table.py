"""The reference of DPO and IPO under full fine-tuning: the base model's log-probabilities of every pair's answers,
computed once, before the first optimizer step, and kept in the run directory.

With LoRA the reference is the policy with its adapters disabled (trainer/preference_step.py). A fully fine-tuned
policy has no such switch, and a second, frozen copy of the model would cost every rank a model's memory (under
ZeRO-3 a second partitioned engine). What DPO and IPO need of the reference is a number per answer, which never
changes: so the loaded base computes it for the train and eval splits in one pass without gradients (each rank a
share, gathered) before the run resumes any checkpoint, and rank 0 writes {run}/reference/{split}.npy (rows x 2,
float64: the chosen then the rejected answer's summed log-probability). A retry or a resume, on any world size,
reads it instead of computing it again; the evaluate stage reads the eval split's. KTO is not covered: its reference
point pairs each answer with another prompt's answer, and which one depends on the batch.
"""

from __future__ import annotations

import io
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from core.errors import UserError
from storage.fs import Location, exists, join, read_bytes, write_bytes_atomic
from storage.split_reader import Split
from trainer.distributed import Dist, dist_sum, gather_objects
from trainer.preference_data import collate_preference
from trainer.preference_loss import sequence_logps

log = logging.getLogger(__name__)

REFERENCE_DIR = "reference"


def table_url(run: Location, split: str) -> Location:
    """{run}/reference/{split}.npy."""
    return join(run, REFERENCE_DIR, f"{split}.npy")


@dataclass(frozen=True)
class ReferenceTable:
    """The reference log-probabilities of a split's pairs: row i's (chosen, rejected)."""

    values: np.ndarray  # (rows, 2) float64

    def logps(self, indices: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """The chosen answers' then the rejected answers' log-probabilities of rows `indices` (a micro-batch's
        sequences in their order)."""
        if not indices:
            raise RuntimeError("a preference micro-batch without its row indices: the reference table needs them")
        picked = self.values[list(indices)]
        return torch.tensor(np.concatenate([picked[:, 0], picked[:, 1]]), dtype=torch.float32, device=device)


@torch.no_grad()
def compute(model: Any, rows: Split, dist: Dist, *, batch_size: int, pad_id: int, lockstep: bool) -> np.ndarray:
    """Every row's reference log-probabilities: row i on rank i % world, in micro-batches, gathered on every rank.
    `lockstep` (ZeRO-3): every rank runs as many forward passes, a short one throw-away ones."""
    mine = list(range(dist.rank, len(rows), dist.world_size))
    groups = [mine[start : start + batch_size] for start in range(0, len(mine), batch_size)]
    passes = math.ceil(math.ceil(len(rows) / dist.world_size) / batch_size) if lockstep else len(groups)
    found: dict[int, tuple[float, float]] = {}
    for k in range(passes):
        group = groups[k] if k < len(groups) else [0]
        batch = collate_preference([rows[i] for i in group], [rows.feedback(i) for i in group], pad_id)
        out = model(**batch.sequences.model_inputs(dist.device))
        values, _ = sequence_logps(out.logits, batch.sequences.labels)
        values = values.double().cpu()
        if k < len(groups):
            n = len(group)
            found.update({i: (float(values[j]), float(values[n + j])) for j, i in enumerate(group)})
    table = np.zeros((len(rows), 2), dtype=np.float64)
    for part in gather_objects(found, dist):
        for i, pair in part.items():
            table[i] = pair
    return table


def load(run: Location, split: str, rows: int) -> ReferenceTable | None:
    """The split's table if the run has it (None if not), checked against the split's row count."""
    url = table_url(run, split)
    if not exists(url):
        return None
    values = np.load(io.BytesIO(read_bytes(url)), allow_pickle=False)
    if values.shape != (rows, 2):
        raise UserError(
            f"{url}: {values.shape[0]} rows of reference log-probabilities, the {split} split has {rows}; it belongs "
            "to another dataset: delete it (it is computed again from the base model) or train as a new run.name"
        )
    return ReferenceTable(values)


def load_or_compute(model: Any, run: Location, split: str, rows: Split, dist: Dist, **batching: Any) -> ReferenceTable:
    """The split's table: read from the run directory, or computed by the model as it is now (the base: called
    before any checkpoint is resumed) and written by rank 0."""
    table = load(run, split, len(rows))
    # Every rank must take the same branch (computing gathers from all of them): a table one rank cannot read yet is
    # computed again by all.
    (readable,) = dist_sum([float(table is not None)], dist)
    if table is not None and readable == dist.world_size:
        log.info("reference log-probabilities of the %s split: %s (computed before)", split, table_url(run, split))
        return table
    started = time.perf_counter()
    values = compute(model, rows, dist, **batching)
    if dist.is_main:
        buffer = io.BytesIO()
        np.save(buffer, values, allow_pickle=False)
        write_bytes_atomic(table_url(run, split), buffer.getvalue())
    log.info(
        "reference log-probabilities of %d %s pairs computed by the base model in %.1f s: %s",
        len(rows),
        split,
        time.perf_counter() - started,
        table_url(run, split),
    )
    return ReferenceTable(values)
