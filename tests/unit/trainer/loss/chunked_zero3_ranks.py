"""The chunked loss (trainer/loss/chunked.py) under real DeepSpeed engines, ZeRO-2 and ZeRO-3, on 2 gloo ranks whose
batches have different numbers of target tokens, so each rank's own chunk count differs (the case that hangs unless
the count is agreed across ranks: under ZeRO-3 every call of the output layer is an all-gather).

The rank side of test_chunked.py's ZeRO test, and its launcher. One launch of 2 processes (this file run as a
module, one per rank) builds an engine per stage and method (LoRA with the output layer among its targets, full
fine-tuning) on tests/unit/trainer/loss/test_chunked.py's tiny model, and compares on every rank the summed loss and
every trainable parameter's full gradient (averaged over the ranks, read after backward and before the step) with the
full-logits ones at rtol 1e-5 in float32: chunked (forced: the tiny vocabulary takes one pass at the default
threshold), in one pass, and at a threshold between the two ranks' target logits, where each rank alone would choose
differently (under ZeRO-3 the choice is agreed, or the ranks' all-gathers mismatch); chunked, the same for each row's
log-probability (the preference objectives' path, weighted by row so that a target counted in another row shows);
and, under ZeRO-3, the evaluation sums, chunked, one rank having no target at all."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from launch.command import free_port

ROOT = Path(__file__).resolve().parents[4]
WORLD = 2
COLLECTIVE_TIMEOUT_S = 20  # a rank left waiting in a collective fails after this instead of hanging
LAUNCH_TIMEOUT_S = 150
CASES = [(stage, method) for stage in (2, 3) for method in ("lora", "full")]


def launch(tmp_path: Path) -> list[dict]:
    """Run this module on WORLD ranks; every rank's result (each compares on its own and exits 1 on a mismatch)."""
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(WORLD),
            "LOCAL_WORLD_SIZE": str(WORLD),
            "OMP_NUM_THREADS": "1",
        }
        log = (tmp_path / f"rank-{rank}.log").open("w")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.unit.trainer.loss.chunked_zero3_ranks", str(tmp_path)],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    try:
        codes = [proc.wait(timeout=max(1.0, deadline - time.monotonic())) for proc in procs]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    logs = "\n".join(f"--- rank {r} ---\n{(tmp_path / f'rank-{r}.log').read_text()[-6000:]}" for r in range(WORLD))
    if codes is None:
        pytest.fail(f"the ranks did not finish in {LAUNCH_TIMEOUT_S} s (a collective called unequally?)\n{logs}")
    assert codes == [0] * WORLD, logs
    return [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(WORLD)]


# ---- one rank (python -m tests.unit.trainer.loss.chunked_zero3_ranks OUT_DIR) ----


def rank_batch(rank: int, *, targets: bool = True) -> tuple:
    """test_chunked's batch, its prompts longer on rank 1 (fewer targets, fewer chunks of CHUNK); no target at
    all with `targets` False."""
    from storage.shards import IGNORE_INDEX
    from tests.unit.trainer.loss.test_chunked import batch

    ids, mask, labels = batch()
    labels[:, : 7 + 24 * rank] = IGNORE_INDEX
    if not targets:
        labels[:] = IGNORE_INDEX
    return ids, mask, labels


def target_count(labels: Any) -> int:
    from storage.shards import IGNORE_INDEX

    return int((labels[:, 1:] != IGNORE_INDEX).sum())


def engine_for(stage: int, method: str) -> Any:
    """A DeepSpeed engine over the tiny model (float32, gradient accumulation 1) with an optimizer that leaves the
    weights as they are (SGD at lr 0): a step only clears the gradients for the next comparison."""
    import deepspeed
    import torch

    from tests.unit.trainer.loss.test_chunked import build
    from trainer.model.adapters import LORA_TARGETS

    model = build(method, lora_targets=[*LORA_TARGETS["qwen2"], "lm_head"] if method == "lora" else None)
    params = [p for p in model.parameters() if p.requires_grad]
    config = {
        "train_micro_batch_size_per_gpu": 3,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**6,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=params, config=config, optimizer=torch.optim.SGD(params, lr=0.0)
    )
    return engine


def loss_and_grads(
    engine: Any, chunk_tokens: int, inputs: tuple, one_pass_max_bytes: int | None = 0, *, per_row: bool = False
) -> tuple[Any, dict[str, Any]]:
    """The summed loss and every trainable parameter's full gradient after DeepSpeed's backward (before the step);
    `per_row`: instead of the loss, the rows' log-probabilities weighted by row (test_chunked.py `weighted_logps`),
    the preference objectives' path."""
    from deepspeed.utils import safe_get_full_grad

    from tests.unit.trainer.loss.test_chunked import head_of, weighted_logps

    ids, mask, labels = inputs
    head = head_of(engine, chunk_tokens, one_pass_max_bytes)
    assert (head.head is None) == (chunk_tokens == 0)
    assert head.partitioned == (chunk_tokens > 0 and engine.zero_optimization_stage() == 3)
    out = engine(input_ids=ids, attention_mask=mask, **head.forward_kwargs(ids.device))
    loss = weighted_logps(head, out, labels) if per_row else head.summed(out, labels)
    engine.backward(loss)
    grads = {
        name: safe_get_full_grad(param).clone()
        for name, param in engine.module.named_parameters()
        if param.requires_grad
    }
    for name, param in engine.module.named_parameters():
        if param.requires_grad:  # the whole gradient, not this rank's partition of it
            assert grads[name].shape == getattr(param, "ds_shape", param.shape), name
    engine.step()
    return loss.detach(), grads


def compare_training(engine: Any, inputs: tuple) -> int:
    """Chunked, one pass, and a threshold the ranks alone would disagree on, each vs full logits on one engine, for
    the loss, and chunked for the rows' log-probabilities; the number of gradients compared."""
    import torch

    from tests.unit.trainer.loss.test_chunked import CHUNK, CHUNKED, ONE_PASS, VOCAB
    from trainer.loss.chunked import LOGIT_BYTES

    between = target_count(rank_batch(1)[2]) * VOCAB * LOGIT_BYTES  # rank 1's own logits fit, rank 0's do not
    full = {per_row: loss_and_grads(engine, 0, inputs, per_row=per_row) for per_row in (False, True)}
    # The rows' log-probabilities share the chunks' machinery with the loss: compared chunked, the case where each
    # chunk's sums go to their rows through a checkpoint (ZeRO-2) or PartitionedChunks (ZeRO-3); in one process also
    # in one pass (test_chunked.py).
    for per_row, one_pass_max_bytes in [(False, CHUNKED), (False, ONE_PASS), (False, between), (True, CHUNKED)]:
        full_loss, full_grads = full[per_row]
        loss, grads = loss_and_grads(engine, CHUNK, inputs, one_pass_max_bytes, per_row=per_row)
        torch.testing.assert_close(loss, full_loss, rtol=1e-5, atol=0)
        assert grads.keys() == full_grads.keys() and full_grads
        for name, grad in full_grads.items():
            assert grad.abs().max() > 0, name
            torch.testing.assert_close(
                grads[name],
                grad,
                rtol=1e-5,
                atol=1e-5 * float(grad.abs().max()),
                msg=f"{name}, one_pass_max_bytes={one_pass_max_bytes}, per_row={per_row}",
            )
    return len(full_grads)


def compare_evaluation(engine: Any, inputs: tuple) -> None:
    """eval_sums, chunked vs full logits, on a ZeRO-3 engine in eval mode."""
    import torch

    from tests.unit.trainer.loss.test_chunked import CHUNK, head_of

    ids, mask, labels = inputs
    engine.eval()
    sums = {}
    with torch.no_grad():
        for chunk in (0, CHUNK):
            head = head_of(engine, chunk)
            out = engine(input_ids=ids, attention_mask=mask, **head.forward_kwargs(ids.device))
            sums[chunk] = head.eval_sums(out, labels)
    (full_loss, full_targets, full_correct), (loss, targets, correct) = sums[0], sums[CHUNK]
    assert (targets, correct) == (full_targets, full_correct) and targets == target_count(labels)
    assert loss == pytest.approx(full_loss, rel=1e-6, abs=0)
    engine.train()


def main(out_dir: Path) -> None:
    import deepspeed
    import torch

    from tests.unit.trainer.loss.test_chunked import CHUNK

    rank = int(os.environ["RANK"])
    deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    inputs = rank_batch(rank)
    chunks = [None] * WORLD  # every rank's own chunk count
    torch.distributed.all_gather_object(chunks, -(-target_count(inputs[2]) // CHUNK))
    result: dict[str, Any] = {"chunks": chunks, "compared": [], "gradients": {}}
    for stage, method in CASES:
        engine = engine_for(stage, method)
        result["gradients"][f"zero{stage}-{method}"] = compare_training(engine, inputs)
        result["compared"].append(f"zero{stage}-{method}")
    # The last engine is ZeRO-3's: rank 1 evaluates a batch without targets (no chunk of its own), rank 0 its own.
    compare_evaluation(engine, rank_batch(rank, targets=rank == 0))
    result["compared"].append("zero3-eval")
    (out_dir / f"rank-{rank}.json").write_text(json.dumps(result))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    # As the trainer's ranks do (trainer/harness.py, exit_now): skip the interpreter's teardown, where a thread
    # DeepSpeed or gloo left joinable at times aborts the process ("terminate called without an active exception",
    # exit -6) after every comparison passed and the result was written. A failed comparison raises before this.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
