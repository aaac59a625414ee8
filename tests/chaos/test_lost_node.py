"""Scenario: a node lost for good. Node 2 of 3 dies at a random step and fails its preflight on every retry after
(the TANDEM_TEST_LOST_NODE hook, as a spot machine that is not given back); with launch.min_nnodes=2 the pipeline's
retry continues on the 2 survivors from the newest complete checkpoint, with the same global batch.

Each run checks that the run completes on the survivors, that the retry resumed from the newest checkpoint saved
before the loss (nothing lost), and that the whole loss trajectory equals an uninterrupted run's (rtol 1e-5). The
row's "time to detect" is the time from the loss to training resuming on the survivors.

Real parts: the whole pipeline (flows.finetune) under the session's Prefect server, torchrun agents with DeepSpeed on
gloo, the tiny model.
"""

from __future__ import annotations

import json

import pytest
from torch.testing import assert_close

from tests.distributed.harness import ELASTIC, Run, Staged, lost_node_pipeline, train


@pytest.fixture(scope="module")
def elastic_reference(staged: Staged) -> Run:
    """The uninterrupted run on 2 nodes (with the global batch fixed, the same trajectory as on 3)."""
    return train(staged, "chaos-elastic-reference", [*ELASTIC, "launch.nnodes=2"])


def test_a_node_lost_for_good(
    prefect_server, staged: Staged, elastic_reference: Run, chaos_run: int, chaos_rng, chaos_record, tmp_path
) -> None:
    died_at = chaos_rng.randint(2, 15)
    summary, run_dir, resume_s = lost_node_pipeline(staged, f"lost-node-{chaos_run}", died_at, tmp_path)
    first, second = json.loads((run_dir / "spec.json").read_text())["attempts"]
    newest_before = 8 if died_at > 8 else 0  # checkpoints every 8 steps; node 2 dies in step `died_at`
    data_lost = second["from_step"] != newest_before
    losses = [
        json.loads(line)["loss"]
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip() and "event" not in json.loads(line)
    ]
    chaos_record(
        "node lost for good: continues on the survivors",
        detect_s=resume_s,
        data_lost=data_lost,
        died_at=died_at,
        resumed_from=second["from_step"],
        nodes=second["nodes"],
    )
    assert summary["registered"] and (first["world_size"], second["world_size"]) == (3, 2)
    assert not data_lost
    assert_close(losses, elastic_reference.losses(), rtol=1e-5, atol=0)
