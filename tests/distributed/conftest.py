"""The reference run shared by the trainer, evaluator and S3 tests."""

from __future__ import annotations

import pytest

from tests.distributed.harness import Run, Staged, train


@pytest.fixture(scope="session")
def reference(staged: Staged) -> Run:
    """2 nodes x 1 rank, ZeRO-2 + LoRA, 12 steps, a checkpoint every 4 keeping the newest 2; its spec also asks
    the evaluator for 3 greedy samples and eval batches of 4 (eval settings never change the training trajectory).

    Every trajectory test compares against it (tests/distributed/test_trainer.py, test_s3_checkpoints.py), and the
    evaluator's tests evaluate its checkpoint and export (test_evaluate.py)."""
    return train(staged, "ref", ["launch.nnodes=2", "train.keep_latest_k=2", "eval.generate_samples=3",
                                 "eval.batch_size=4", "eval.max_new_tokens=12"])
