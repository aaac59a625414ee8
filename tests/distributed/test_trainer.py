"""The trainer under real torchrun agents (2 "nodes" on 127.0.0.1), DeepSpeed on gloo, the tiny model.

Every test runs `python -m trainer` exactly as the pipeline does and checks what users see: the loss
trajectory in metrics.jsonl, the files on storage, the exit and the error text.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from torch.testing import assert_close

from config.sections.model_train import TrainConfig
from core.errors import RetryableError, UserError
from launch.node import failure_exit_code
from storage.location import Location
from tests.distributed.harness import TOOL_CALL_DATA, Run, Staged, eval_exported, train
from tests.qwen_configs import QWEN_ZERO2


def qwen_json(tmp_path: Path, content: dict) -> str:
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(content))
    return str(path)


def final_eval(run: Run) -> dict:
    return next(r for r in run.metrics() if r.get("event") == "final_eval")


def test_loss_falls_and_retention_keeps_exactly_k(reference: Run) -> None:
    losses = reference.losses()
    assert len(losses) == 12 and losses[-1] < losses[0] - 0.2
    names = sorted(p.name for p in (reference.run_dir / "checkpoints").iterdir())
    assert names == ["step-00000008", "step-00000012"]
    assert all((reference.run_dir / "checkpoints" / n / "COMPLETE").exists() for n in names)


def test_the_final_evaluation_takes_rows_spread_over_the_split_which_the_export_reproduces(reference: Run) -> None:
    """eval.final_eval_rows=7 in the reference's spec: the trainer's in-memory evaluation covers 7 rows spread over
    the eval split, not all of it, and the exported model gives the same loss on those rows."""
    result = final_eval(reference)
    manifest = json.loads((Path(reference.spec.dataset.url) / "manifest.json").read_text())
    assert result["examples"] == 7 < manifest["splits"]["eval"]["records"]
    assert_close(eval_exported(reference), result["loss"], rtol=1e-5, atol=1e-5)
    steps = [r for r in reference.metrics() if "event" not in r]
    assert all(0 <= r["data_time_s"] < r["step_time_s"] for r in steps)  # each step's time to read its rows


@pytest.mark.multirun
def test_node_layout_does_not_change_the_trajectory(staged: Staged, reference: Run) -> None:
    one_node = train(staged, "layout-1x2", ["launch.nnodes=1", "launch.nproc_per_node=2"])
    assert_close(one_node.losses(), reference.losses(), rtol=1e-9, atol=1e-9)


@pytest.mark.multirun
def test_resume_skips_incomplete_and_corrupt_checkpoints_and_reproduces_the_trajectory(
    staged: Staged, reference: Run
) -> None:
    """Rank 1 dies at step 9, after checkpoints 4 and 8; step 8 then loses its COMPLETE marker. The next run resumes
    from step 4 (a checkpoint without COMPLETE does not exist) and reproduces the reference exactly. A corrupt
    shard in step 12 is then caught by its digest: the run after resumes from step 8 and keeps the corrupt one aside;
    asked explicitly for a corrupt checkpoint, a run refuses."""
    with pytest.raises(RetryableError, match="train failed on node 1, rank 1 exited with code 137"):
        train(staged, "resume", ["launch.nnodes=2"], env={"TANDEM_TEST_EXIT_AT_STEP": "1:9"})
    run_dir = Path(staged.storage) / "runs" / "resume"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-00000004", "step-00000008"]
    (run_dir / "checkpoints" / "step-00000008" / "COMPLETE").unlink()
    resumed = train(staged, "resume", ["launch.nnodes=2"])
    log_path = run_dir / "nodes" / "0" / "log.txt"
    assert "resumed from step 4" in log_path.read_text()
    assert_close(resumed.losses(), reference.losses(), rtol=1e-9, atol=1e-9)

    step12 = resumed.checkpoint(12)
    manifest = json.loads((step12 / "manifest.json").read_text())
    shard = step12 / next(f["path"] for f in manifest["files"] if f["path"].endswith("optim_states.pt"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different bytes: only the digest can tell
    shard.write_bytes(bytes(data))
    train(staged, "resume", ["launch.nnodes=2", "train.max_steps=16"])
    log = log_path.read_text()
    assert f"not resuming from step 12: {shard}: blake3 digest" in log
    assert "resumed from step 8" in log

    kept = [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("corrupt-step-00000012-")]
    assert len(kept) == 1  # moved aside for inspection, then step 12 was trained and saved again
    assert (step12 / "COMPLETE").exists()

    step16 = resumed.checkpoint(16)
    shard16 = step16 / shard.relative_to(step12)
    data = bytearray(shard16.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard16.write_bytes(bytes(data))
    with pytest.raises(UserError, match="the checkpoint is corrupt, pick another one"):
        train(staged, "resume-explicit", ["launch.nnodes=2", f"train.resume={step16}"])


def test_a_checkpoint_of_two_ranks_resumes_on_one(staged: Staged, reference: Run) -> None:
    """The default run's one resharding case, on the reference's step-8 checkpoint (copied into a new run, as a retry
    finds it): it is converted once to DeepSpeed's universal form beside the checkpoint, whose fp32 weights are the
    checkpoint's own, and training continues on 1 rank to step 12. (The exact trajectory across world sizes, with
    dropout 0, for ZeRO-2/3 and LoRA/full, is the elastic suite's: tests/distributed/test_elastic.py.)"""
    import shutil

    import torch

    from storage.checkpoints import read_complete, read_universal

    target = Path(staged.storage) / "runs" / "reshard-2to1" / "checkpoints" / "step-00000008"
    shutil.copytree(reference.checkpoint(8), target)
    resumed = train(staged, "reshard-2to1", ["launch.nnodes=1", "train.global_batch_size=8"])
    log = (resumed.run_dir / "nodes" / "0" / "log.txt").read_text()
    assert "resumed from step 8 written by 2 ranks, now on 1" in log
    assert [r["step"] for r in resumed.metrics() if "event" not in r] == [9, 10, 11, 12]
    assert json.loads((resumed.checkpoint(12) / "manifest.json").read_text())["world_size"] == 1
    universal = read_universal(read_complete(Location(str(target))))
    assert universal is not None and universal.manifest["source_world_size"] == 2
    module = torch.load(target / "rank-00000" / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    lora = {name: tensor for name, tensor in module.items() if "lora_" in name}
    assert lora
    for name, tensor in lora.items():
        converted = torch.load(target / "universal" / "zero" / name / "fp32.pt", weights_only=False)["param"]
        assert torch.equal(converted, tensor.float()), name
    # Dropout (0.1 here) draws other masks on another world size, so the losses are near the reference's, not equal.
    assert_close(resumed.losses(), reference.losses()[8:], rtol=0.05, atol=0)


def test_lora_zero3_matches_zero2_and_exports_a_real_adapter(zero3: Run, reference: Run) -> None:
    # Both train with the loss from the last hidden states, in one pass at the tiny vocabulary (ZeRO-3's through its
    # partitioned path, the choice agreed across ranks), so the same trajectory is also that loss under ZeRO-3
    # training as under ZeRO-2 (and as the full logits, qwen_zero2_slow_rank).
    # Chunks: tests/unit/trainer/loss/test_chunked*.
    chunk = TrainConfig.model_fields["loss_chunk_tokens"].default
    logged = (
        f"in chunks of {chunk} target tokens (train.loss_chunk_tokens), the choice and the chunk count agreed "
        "across ranks (ZeRO-3)"
    )
    assert logged in (zero3.run_dir / "nodes" / "0" / "log.txt").read_text()
    assert_close(zero3.losses(), reference.losses(), rtol=1e-5, atol=1e-5)
    from safetensors.torch import load_file

    adapter = load_file(str(zero3.run_dir / "final" / "adapter_model.safetensors"))
    lora_b = [t for name, t in adapter.items() if "lora_B" in name]
    assert lora_b and all(t.numel() > 0 for t in adapter.values())
    assert any(t.abs().sum() > 0 for t in lora_b)  # B starts at zero: non-zero means trained weights were gathered
    assert_close(eval_exported(zero3), final_eval(zero3)["loss"], rtol=1e-5, atol=1e-5)


def test_profiled_steps_are_named_and_each_rank_writes_its_table(zero3: Run) -> None:
    """train.profile_steps=2 in the ZeRO-3 run (whose trajectory equals the reference's, above): steps 4 and 5, after
    the attempt's three warm-up steps, are flagged in metrics.jsonl and named by a `profile` event, and each rank's
    table holds the operations its steps ran."""
    rows = zero3.metrics()
    assert [r["step"] for r in rows if r.get("profiled")] == [4, 5]
    (event,) = [r for r in rows if r.get("event") == "profile"]
    assert (event["first_step"], event["last_step"], event["table"]) == (4, 5, "profile/rank-{rank}.txt")
    for rank in (0, 1):
        table = (zero3.run_dir / "profile" / f"rank-{rank}.txt").read_text()
        assert table.startswith("steps 4-5 (2), wall ") and "By self CPU time:" in table
        # The matmuls and ZeRO-3's parameter gathers: both near the top on every rank. (Its gradients' reduce-scatter
        # takes little CPU time and may fall below the table's rows on a rank.)
        assert "aten::mm" in table and "c10d::_allgather_base_" in table


@pytest.fixture(scope="module")
def qwen_zero2_slow_rank(staged: Staged, tmp_path_factory) -> Run:
    """Qwen's ZeRO-2 JSON as it is, with rank 1 sleeping 0.1 s per micro-batch and a straggler check every 2
    steps, and reaching the final export 3 s after rank 0: a slow rank changes the timing, never the trajectory,
    so one run serves the three tests below. Its loss takes the full logits (train.loss_chunk_tokens=0), the
    reference's and the ZeRO-3 run's the loss from the last hidden states: the same trajectory is also that loss
    training as the unfused one does."""
    ds_config = qwen_json(tmp_path_factory.mktemp("qwen-zero2"), QWEN_ZERO2)
    return train(
        staged,
        "qwen-zero2",
        [
            "launch.nnodes=2",
            f"deepspeed.config={ds_config}",
            "train.straggler_check_steps=2",
            "train.loss_chunk_tokens=0",
        ],
        env={"TANDEM_TEST_SLOW_RANK": "1:0.1", "TANDEM_TEST_LATE_EXPORT": "1:3"},
    )


def test_qwen_zero2_json_loads_unchanged(qwen_zero2_slow_rank: Run, reference: Run) -> None:
    # The reference's loss is the one from the last hidden states, this run's the full-logits one (see the fixture).
    chunk = TrainConfig.model_fields["loss_chunk_tokens"].default
    logged = f"beyond that in chunks of {chunk} target tokens (train.loss_chunk_tokens)"
    assert logged in (reference.run_dir / "nodes" / "0" / "log.txt").read_text()
    assert "loss: from full logits" in (qwen_zero2_slow_rank.run_dir / "nodes" / "0" / "log.txt").read_text()
    assert_close(qwen_zero2_slow_rank.losses(), reference.losses(), rtol=1e-5, atol=1e-5)


def test_a_rank_late_to_the_export_joins_it(qwen_zero2_slow_rank: Run) -> None:
    """Every rank takes rank 0's view of whether final/ is already exported: a late rank that decided alone would see
    rank 0's fresh export, skip the export's barrier and leave rank 0 waiting on a peer that has exited."""
    final = qwen_zero2_slow_rank.run_dir / "final"
    assert (final / "COMPLETE").exists() and json.loads((final / "manifest.json").read_text())["step"] == 12


@pytest.mark.multirun
def test_micro_batch_and_accumulation_are_interchangeable(staged: Staged) -> None:
    common = ["launch.nnodes=2", "train.lora.dropout=0", "train.max_steps=6", "train.save_steps=6"]
    small = train(staged, "mb1x4", [*common, "train.micro_batch_size=1", "train.gradient_accumulation_steps=4"])
    large = train(staged, "mb4x1", [*common, "train.micro_batch_size=4", "train.gradient_accumulation_steps=1"])
    assert_close(small.losses(), large.losses(), rtol=1e-4, atol=1e-4)


def test_qlora_trains_on_cpu_and_exports_merged_weights(staged: Staged) -> None:
    run = train(
        staged,
        "qlora",
        ["launch.nnodes=2", "train.method=qlora", "train.export_merged=true", "train.gradient_checkpointing=true"],
    )
    losses = run.losses()
    assert losses[-1] < losses[0] - 0.1
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(run.run_dir / "final" / "merged")
    assert not any("lora" in name for name, _ in merged.named_parameters())


def test_full_finetuning_with_zero3_exports_safetensors(tool_calls: Staged, published_tiny_sharded: str) -> None:
    """On tool-calling data (ShareGPT with function_call/observation turns and tools), packed two to a row, with a
    model directory laid out as Qwen publishes Qwen2.5-0.5B/1.5B/3B (tied input and output embeddings, no
    pad_token_id in config.json, bf16 shards with model.safetensors.index.json): the export writes the tied weight
    once, as save_pretrained does, and reproduces the in-memory model's evaluation."""
    manifest = json.loads((Path(tool_calls.dataset.url) / "manifest.json").read_text())
    assert manifest["records"]["rejected"] == 0 and manifest["records"]["staged"] == 41
    train_split = manifest["splits"]["train"]
    assert manifest["packing"] and train_split["rows"] == (train_split["records"] + 1) // 2
    run = train(
        dataclasses.replace(tool_calls, model_path=published_tiny_sharded),
        "full-zero3",
        [
            "launch.nnodes=2",
            "train.method=full",
            "train.learning_rate=0.001",
            "deepspeed.config=config/deepspeed/zero3.json",
            *TOOL_CALL_DATA,
        ],
    )
    assert run.losses()[-1] < run.losses()[0] - 0.2
    # Trained and evaluated with the loss from the last hidden states (ZeRO-3's partitioned path): eval_exported's
    # full logits agreeing with final_eval checks it.
    logged = "the choice and the chunk count agreed across ranks (ZeRO-3)"
    assert logged in (run.run_dir / "nodes" / "0" / "log.txt").read_text()
    # A step is 8 rows (2 x 2 x 2 ranks), a row two conversations but the epoch's odd one out: tokens count them all.
    assert all(r["tokens"] > 15 * 290 for r in run.metrics() if "event" not in r)
    from safetensors import safe_open

    with safe_open(run.run_dir / "final" / "model.safetensors", "pt") as exported:
        names = set(exported.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names  # tied: written once
    exported_config = json.loads((run.run_dir / "final" / "config.json").read_text())
    assert exported_config["tie_word_embeddings"] is True
    # Published without pad_token_id: training padded with the tokenizer's pad token, and the export says which.
    tokenizer_config = json.loads((Path(published_tiny_sharded) / "tokenizer_config.json").read_text())
    added = json.loads((Path(published_tiny_sharded) / "tokenizer.json").read_text())["added_tokens"]
    assert exported_config["pad_token_id"] == next(
        t["id"] for t in added if t["content"] == tokenizer_config["pad_token"]
    )
    assert_close(eval_exported(run), final_eval(run)["loss"], rtol=1e-5, atol=1e-5)


def test_a_slow_rank_is_reported_as_a_straggler(qwen_zero2_slow_rank: Run) -> None:
    run = qwen_zero2_slow_rank
    events = [r for r in run.metrics() if r.get("event") == "straggler"]
    assert events and {e["rank"] for e in events} == {1}
    # Above 2x: against the plain median (the mean of two ranks) a slow rank of two could never get there.
    assert all(e["ratio"] > 2 and e["host"] for e in events)
    assert f"straggler at step {events[0]['step']}: rank 1 on" in (run.run_dir / "nodes" / "0" / "log.txt").read_text()


def test_a_stalled_rank_stops_the_job_naming_node_and_rank(staged: Staged) -> None:
    import time

    started = time.monotonic()
    with pytest.raises(RetryableError) as info:
        train(
            staged,
            "stall",
            ["launch.nnodes=2", "launch.stall_timeout=5", "train.max_steps=6"],
            env={"TANDEM_TEST_STALL_AT_STEP": "1:3"},
        )
    message = str(info.value)
    assert message.startswith("training stalled: no new step for")
    assert "last step 2" in message and "node 1 rank 1 is the slowest" in message
    assert time.monotonic() - started < 90  # not NCCL/gloo's 30-minute timeout
    import subprocess

    # This run's ranks only: another test session on the machine may be running the same test.
    ranks = f"trainer --spec {re.escape(str(staged.storage))}/runs/stall/"
    leftovers = subprocess.run(["pgrep", "-f", ranks], capture_output=True)
    assert leftovers.returncode == 1, leftovers.stdout  # every rank of every node is gone


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        # every rank sees the all-reduced NaN, so either node may report it
        (
            "TANDEM_TEST_NAN_AT_STEP",
            r"train failed on node (0, rank 0|1, rank 1): training diverged: the loss is nan "
            r"at step 3 on every rank; lower train\.learning_rate",
        ),
        ("TANDEM_TEST_OOM_AT_STEP", r"train failed on node 1, rank 1: out of memory on node 1 \("),
        # a bug: its type, the project function and file:line it was raised from, its message; then where the
        # traceback is (the node's log), all on one line, torchrun's own report of the failure left out
        (
            "TANDEM_TEST_RAISE_AT_STEP",
            r"train failed on node 1, rank 1: ValueError in poison \(trainer/watch/faults\.py:\d+\): injected by "
            r"TANDEM_TEST_RAISE_AT_STEP at step 3 \(traceback: .*/runs/guard-raise/nodes/1/log\.txt\)$",
        ),
    ],
    ids=["diverged", "out-of-memory", "crash"],
)
def test_a_failure_a_retry_would_repeat_stops_unretried_naming_the_rank(
    staged: Staged, fault: str, message: str
) -> None:
    """A NaN loss, the error a GPU raises when out of memory (raised on CPU by a fault hook: there is no GPU here) and
    a plain exception in one rank (a bug) stop the job as a UserError (not retried) whose first line says where and
    what to change; the step's weights are never saved, so the newest complete checkpoint is the one before."""
    from storage.checkpoints import latest_complete

    name = f"guard-{fault.split('_')[2].lower()}"
    with pytest.raises(UserError) as info:
        train(staged, name, ["launch.nnodes=2", "train.max_steps=6", "train.save_steps=2"], env={fault: "1:3"})
    first_line = str(info.value).splitlines()[0]
    assert re.match(message, first_line), first_line
    if fault == "TANDEM_TEST_RAISE_AT_STEP":
        assert str(info.value) == first_line  # one line, and the traceback is where it says
        log = (Path(staged.storage) / "runs" / name / "nodes" / "1" / "log.txt").read_text()
        assert "Traceback (most recent call last)" in log and "injected by TANDEM_TEST_RAISE_AT_STEP" in log
    if fault == "TANDEM_TEST_OOM_AT_STEP":
        assert "at step 3: CUDA out of memory. Tried to allocate 2.00 GiB" in first_line
        assert "lower train.micro_batch_size" in first_line
    run_url = staged.run(name)
    assert latest_complete(run_url).step == 2
    # Every local node ran the node lifecycle: the failed node left the note that stops its peers and recorded its
    # error's exit code in status.json, and no node still claims its rank.
    note = json.loads((Path(run_url.url) / "nodes" / "stop.json").read_text())
    reported = int(re.match(r"train failed on node (\d+)", first_line)[1])
    assert note["exit_code"] == 2 and failure_exit_code(run_url, reported) == 2
    assert not list(Path(run_url.url).glob("nodes/*/claim.json"))
