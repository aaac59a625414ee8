"""The runs shared by the trainer, evaluator and S3 tests (tests/distributed is one work unit under xdist, so each is
made once per session)."""

from __future__ import annotations

import json

import pytest

from tests.distributed.harness import TOOL_CALL_DATA, Run, Staged, stage, tool_call_conversations, train
from tests.lm_tasks import ANSWER_TASK, CHOICE_TASK, write_tasks
from tests.qwen_configs import QWEN_ZERO3


@pytest.fixture(scope="session")
def reference(staged: Staged, tmp_path_factory) -> Run:
    """2 nodes x 1 rank, ZeRO-2 + LoRA, 12 steps, a checkpoint every 4 keeping the newest 2; its spec also asks
    the evaluator for 3 greedy samples, eval batches of 4, 9 generated answers scored (in batches of 2: 5 batches,
    which 2 and 3 ranks share unevenly) and two benchmark tasks of our own (tests/lm_tasks.py: 7 documents each), and
    the trainer's final evaluation for 7 rows of the eval split (eval settings never change the training trajectory).

    Every trajectory test compares against it (tests/distributed/test_trainer.py, test_s3_checkpoints.py), and the
    evaluator's tests evaluate its checkpoint and export (test_evaluate.py)."""
    return train(
        staged,
        "ref",
        [
            "launch.nnodes=2",
            "train.keep_latest_k=2",
            "eval.generate_samples=3",
            "eval.batch_size=4",
            "eval.max_new_tokens=12",
            "eval.final_eval_rows=7",
            "eval.generate.enabled=true",
            "eval.generate.max_records=9",
            "eval.generate.batch_size=2",
            "eval.generate.max_new_tokens=8",
            f"eval.tasks.names=[{CHOICE_TASK},{ANSWER_TASK}]",
            f"eval.tasks.include_path={write_tasks(tmp_path_factory.mktemp('lm-tasks'))}",
            "eval.tasks.batch_size=2",
        ],
    )


@pytest.fixture(scope="session")
def zero3(staged: Staged, tmp_path_factory) -> Run:
    """The reference run under Qwen's ZeRO-3 JSON as it is: LoRA weights partitioned across the 2 ranks, gathered to
    export (tests/distributed/test_trainer.py compares it with the reference, test_evaluate.py evaluates it). Steps
    4-5 run under the PyTorch profiler (train.profile_steps=2), which must change nothing of the trajectory."""
    ds_config = tmp_path_factory.mktemp("qwen-zero3") / "ds_config.json"
    ds_config.write_text(json.dumps(QWEN_ZERO3))
    return train(staged, "zero3", ["launch.nnodes=2", f"deepspeed.config={ds_config}", "train.profile_steps=2"])


@pytest.fixture(scope="session")
def tool_calls(staged: Staged, tmp_path_factory) -> Staged:
    """41 tool-calling conversations staged for the session's tiny model beside the sample data, packed (train it
    with TOOL_CALL_DATA): the run that trains on them takes packed shards through the real trainer, its in-memory
    evaluation and the exported model's."""
    source = tmp_path_factory.mktemp("tool-calls") / "glaive.json"
    source.write_text(json.dumps(tool_call_conversations(41)))
    return stage(staged.storage, staged.model_path, [f"data.source={source}", *TOOL_CALL_DATA])
