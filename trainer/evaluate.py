"""Evaluate a model on the eval split under torchrun, exactly.

    torchrun ... -m trainer.evaluate --spec {run}/spec.json --model {run}/final
    torchrun ... -m trainer.evaluate --spec {run}/spec.json --model {run}/checkpoints/step-00000030

Row i of the shards (one example, or several packed) goes to rank i % world_size (each to exactly one rank,
no padding duplicates), each rank reading only its own rows from the memory-mapped shards; each rank sums loss,
predicted target tokens and correct tokens; the sums are all-reduced and divided once, so the result equals a
single-process evaluation of the same data. Rank 0 writes eval.json (and, with eval.generate_samples, samples.jsonl).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import math
from collections.abc import Sequence
from typing import Any

import torch

from core.errors import UserError
from storage import layout
from storage.fs import write_json_atomic
from storage.local_dataset import open_split
from storage.location import ARGUMENT_FORM, Location, join, location_argument
from storage.node_cache import cache_root, node_cache
from storage.shards import Row, examples_of
from storage.spec import Spec
from storage.split_reader import Split
from trainer.chunked_loss import LossHead
from trainer.data import collate
from trainer.distributed import Dist, dist_sum
from trainer.eval_model import is_checkpoint, load_for_eval
from trainer.model import ensure_pad_token_id

log = logging.getLogger(__name__)


def sample_rows(rows: int, count: int) -> list[int]:
    """`count` row indices spread evenly over a split of `rows` rows (every row when count is 0 or not smaller): the
    rows the trainer's final evaluation uses, so that the exported model can be held to it on the same rows."""
    if count == 0 or count >= rows:
        return list(range(rows))
    return [i * rows // count for i in range(count)]


@torch.no_grad()
def local_sums(
    model: Any,
    examples: Sequence[Row],
    indices: Sequence[int],
    *,
    rank: int,
    world: int,
    batch_size: int,
    pad_id: int,
    device: torch.device,
    loss_chunk_tokens: int,
    lockstep: bool = False,
) -> tuple[float, int, int, int]:
    """(summed loss, target tokens, correct tokens, examples) over this rank's share of the rows `indices` of
    `examples` (the split's rows; a packed row counts each of its examples).

    With `lockstep` (a ZeRO-3 engine, whose forward is collective) every rank runs the same number of
    forward passes (and of the chunked loss's output-layer calls, which LossHead.eval_sums agrees across ranks):
    ranks with fewer rows run throw-away passes so nobody waits forever.
    """
    mine = indices[rank::world]
    batches = [mine[start : start + batch_size] for start in range(0, len(mine), batch_size)]
    passes = math.ceil(math.ceil(len(indices) / world) / batch_size) if lockstep else len(batches)
    loss_sum, targets, correct, count = 0.0, 0, 0, 0
    loss = LossHead.of(model, loss_chunk_tokens)
    for index in range(passes):
        rows = [examples[i] for i in (batches[index] if index < len(batches) else indices[:1])]
        batch = collate(rows, pad_id)
        out = model(**batch.model_inputs(device), **loss.forward_kwargs(device))
        # A throw-away pass takes its sums too, and drops them: under ZeRO-3 the chunked loss's output layer is a
        # collective as well, called as often on every rank.
        sums = loss.eval_sums(out, batch.labels)
        if index < len(batches):
            loss_sum, targets, correct = loss_sum + sums[0], targets + sums[1], correct + sums[2]
            count += sum(len(row.segments) for row in rows)
    return loss_sum, targets, correct, count


def reduced_metrics(sums: tuple[float, int, int, int], dist: Dist) -> dict[str, Any]:
    """SUM-reduce the per-rank sums and divide once."""
    loss_sum, targets, correct, count = dist_sum(sums, dist)
    if targets == 0:
        raise UserError(
            f"the eval split has no target tokens ({int(count)} examples); set data.eval_ratio > 0 "
            "or give data with assistant answers"
        )
    loss = loss_sum / targets
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "token_accuracy": correct / targets,
        "loss_sum": loss_sum,
        "target_tokens": int(targets),
        "correct_tokens": int(correct),
        "examples": int(count),
    }


def evaluate(spec: Spec, model_url: Location, dist: Dist) -> dict[str, Any]:
    """All-reduced eval metrics; rank 0 writes them to {run}/eval.json."""
    examples = open_split(spec.dataset_dir, "eval", node_cache(spec.config.launch), spec.dataset.manifest_digest)
    if not examples:
        raise UserError(f"{spec.dataset_dir}: the eval split is empty; stage the data with data.eval_ratio > 0")
    model = load_for_eval(model_url, spec, dist.device, dist)
    pad_id = ensure_pad_token_id(model, spec.model_path)
    if spec.config.train.objective != "sft":
        return write_result(spec, model_url, dist, evaluate_preference(spec, model, examples, dist, pad_id))
    sums = local_sums(
        model,
        examples,
        range(len(examples)),
        rank=dist.rank,
        world=dist.world_size,
        batch_size=spec.config.eval.batch_size,
        pad_id=pad_id,
        device=dist.device,
        loss_chunk_tokens=spec.config.train.loss_chunk_tokens,
    )
    result = eval_document(spec, model_url, dist, reduced_metrics(sums, dist))
    if spec.config.eval.generate_samples:
        from trainer.samples import write_samples

        first = examples_of(itertools.islice(examples, spec.config.eval.generate_samples))
        result["samples_url"] = write_samples(model, first, spec, dist, pad_id)
    if dist.is_main:
        write_json_atomic(join(spec.run, layout.EVAL), result)
        log.info(
            "eval loss %.4f perplexity %.2f token accuracy %.4f over %d target tokens",
            result["loss"],
            result["perplexity"],
            result["token_accuracy"],
            result["target_tokens"],
        )
    return result


def eval_document(spec: Spec, model_url: Location, dist: Dist, metrics: dict[str, Any]) -> dict[str, Any]:
    """eval.json's document: the metrics, and what was evaluated on what."""
    return {
        "schema": layout.EVAL_SCHEMA,
        **metrics,
        "world_size": dist.world_size,
        "model_url": str(model_url),
        "model_kind": "checkpoint" if is_checkpoint(model_url) else "export",
        "dataset_id": spec.dataset.dataset_id,
    }


def evaluate_preference(spec: Spec, model: Any, examples: Split, dist: Dist, pad_id: int) -> dict[str, Any]:
    """The preference metrics of train.objective over the whole eval split (trainer/preference_train.py)."""
    from trainer import reference_table
    from trainer.preference_step import Objective
    from trainer.preference_train import preference_eval

    objective = Objective.of(spec.config.train)
    table = None
    if spec.config.train.method == "full" and objective.needs_reference:
        table = reference_table.load(spec.run, "eval", len(examples), cache_root(spec.config.launch.node_cache_dir))
        if table is None:
            raise UserError(
                f"{reference_table.table_url(spec.run, 'eval')}: missing; full fine-tuning's {objective.name} "
                "reference log-probabilities are written by the train stage before its first step: train the run first"
            )
    metrics = preference_eval(
        model,
        examples,
        range(len(examples)),
        objective,
        dist,
        batch_size=spec.config.eval.batch_size,
        pad_id=pad_id,
        table=table,
    )
    return {**metrics, "reference": reference_of(spec.config.train.objective, spec.config.train.method)}


def reference_of(objective: str, method: str) -> str | None:
    """The reference model a preference objective compared with, in words (eval.json, the model card)."""
    if objective in ("sft", "orpo"):
        return None
    if method == "full":
        return "the base model's log-probabilities, computed before training (reference/ in the run directory)"
    return f"the base model ({method} adapters disabled)"


def write_result(spec: Spec, model_url: Location, dist: Dist, metrics: dict[str, Any]) -> dict[str, Any]:
    """eval.json of preference metrics, written by rank 0."""
    result = eval_document(spec, model_url, dist, metrics)
    if dist.is_main:
        write_json_atomic(join(spec.run, layout.EVAL), result)
        log.info(
            "eval %s loss %.4f reward accuracy %.4f reward margin %.4f over %d units",
            result["objective"],
            result["loss"],
            result["reward_accuracy"],
            result["reward_margin"],
            result["units"],
        )
    return result


def main(argv: list[str] | None = None) -> int:
    """CLI entry for one rank."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer.evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spec", required=True, type=location_argument, help=f"the run's spec.json: {ARGUMENT_FORM}")
    parser.add_argument(
        "--model",
        required=True,
        help="URL of an exported model (final/) or a checkpoint (checkpoints/step-N), with COMPLETE",
    )
    args = parser.parse_args(argv)
    from trainer.harness import run_rank

    # The model is under the run's storage: reached with its options.
    return run_rank(
        args.spec, lambda spec, dist: evaluate(spec, spec.run.with_url(args.model), dist), deepspeed_backend=False
    )


if __name__ == "__main__":
    from trainer.harness import exit_now

    exit_now(main())
