"""trainer/evaluation/stage.py's own pieces that need no ranks: `sample_rows`, the rows the trainer's final evaluation
uses and
the exported model is held to (every row, or `count` spread evenly, each once, in order); eval.json's document (the
metrics, the world size of the evaluation, what was evaluated, checkpoint or export, on which dataset); and the
command line's refusal of a malformed --spec. The all-reduced evaluation itself is
tests/distributed/test_evaluate.py."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from storage import layout
from storage.location import Location
from tests.checkpoints import save_checkpoint
from tests.specs import spec_for
from trainer.data import sample_rows
from trainer.evaluation.stage import eval_document
from trainer.parallel.distributed import Dist


@pytest.mark.parametrize(
    ("rows", "count", "expected"),
    [
        (10, 4, [0, 2, 5, 7]),
        (9, 3, [0, 3, 6]),
        (7, 1, [0]),
        (5, 0, [0, 1, 2, 3, 4]),  # eval.final_eval_rows 0: the whole split
        (5, 5, [0, 1, 2, 3, 4]),
        (3, 8, [0, 1, 2]),  # more asked than there are: each row once
        (0, 4, []),
    ],
)
def test_sample_rows_are_every_row_or_count_spread_evenly(rows: int, count: int, expected: list[int]) -> None:
    assert sample_rows(rows, count) == expected


def test_sampled_rows_are_distinct_ordered_and_evenly_spaced() -> None:
    for rows, count in ((1000, 7), (101, 100), (64, 63), (12345, 256)):
        picked = sample_rows(rows, count)
        gaps = {b - a for a, b in itertools.pairwise(picked)}
        assert len(picked) == count and picked[0] == 0 and picked[-1] < rows
        assert min(gaps) >= 1 and max(gaps) - min(gaps) <= 1, (rows, count, gaps)


def test_eval_json_names_what_was_evaluated_on_what(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, [])
    dist = Dist(rank=0, local_rank=0, world_size=3, node_rank=0, host="h", device=torch.device("cpu"))
    metrics = {"loss": 1.5, "perplexity": 4.48, "examples": 10, "world_size": 99}
    checkpoint = save_checkpoint(tmp_path / "runs" / "r", 8)
    assert eval_document(spec, checkpoint, dist, metrics) == {
        "schema": layout.EVAL_SCHEMA,
        "loss": 1.5,
        "perplexity": 4.48,
        "examples": 10,
        "world_size": 3,  # the ranks that evaluated, whatever the metrics say
        "model_url": f"{tmp_path}/runs/r/checkpoints/step-00000008",
        "model_kind": "checkpoint",
        "dataset_id": "d",
    }
    export = Location(str(tmp_path / "runs" / "r" / "final"))
    assert eval_document(spec, export, dist, {"loss": 1.0})["model_kind"] == "export"
