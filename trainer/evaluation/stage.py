"""The evaluate stage: a model on the eval split, exactly (its entry: trainer/evaluate.py).

The run's objective (trainer/objectives/) evaluates the eval split: row i of the shards (one example, or several
packed, or a preference unit) goes to rank i % world_size (each to exactly one rank, no padding duplicates), each rank
reading only its own rows from the memory-mapped shards and summing what the objective's metrics are divided from
(SFT: loss, predicted target tokens, correct tokens); the sums are all-reduced and divided once, so the result equals
a single-process evaluation of the same data. Rank 0 writes eval.json (and, with eval.generate_samples, samples.jsonl).
With eval.tasks, lm-evaluation-harness's tasks run on the same model in memory, shared across the ranks
(trainer/evaluation/lm_tasks.py). With eval.compare_base the base model is evaluated the same way after it, or read
from its cache
(trainer/evaluation/base_model.py).
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import torch

from config.objectives import SUPERVISED_DATA
from core.errors import UserError
from storage import layout
from storage.fs import write_json_atomic
from storage.location import Location, join
from storage.metrics import GENERATE, beside_base
from storage.shards import examples_of
from storage.spec import Spec
from storage.split_reader import Split
from trainer.data import sample_rows, split_of
from trainer.evaluation.load import is_checkpoint, load_for_eval
from trainer.images import ImageInputs
from trainer.model.load import ensure_pad_token_id, model_config
from trainer.objectives.base import EvalOptions, TrainObjective
from trainer.objectives.registry import build
from trainer.parallel.distributed import Dist

log = logging.getLogger(__name__)


def evaluate(spec: Spec, model_url: Location, dist: Dist) -> dict[str, Any]:
    """The objective's all-reduced eval metrics (and the base model's beside them with eval.compare_base); rank 0
    writes them to {run}/eval.json."""
    examples = split_of(spec, "eval")
    if not examples:
        raise UserError(f"{spec.dataset_dir}: the eval split is empty; stage the data with data.eval_ratio > 0")
    objective = build(spec.config.train)
    objective.start_evaluation(spec, examples)
    tasks = task_index(spec)  # a wrong task name stops here, before any model is loaded
    model = load_for_eval(model_url, spec, dist.device, dist)
    result = eval_document(
        spec, model_url, dist, measure(model, objective, examples, spec, dist, tasks) | objective.eval_fields()
    )
    # Samples continue a prompt where its reference answer starts: examples have one, preference rows two or a label.
    if spec.config.eval.generate_samples and objective.objective.data == SUPERVISED_DATA:
        from trainer.evaluation.samples import write_samples

        remote = spec.config.model.trust_remote_code
        images = ImageInputs.of(spec.model_path, model_config(spec.model_path, trust_remote_code=remote))
        token = images.image_token if images is not None else -1
        first = examples_of(itertools.islice(examples, spec.config.eval.generate_samples), token)
        pad_id = ensure_pad_token_id(model, spec.model_path, trust_remote_code=remote)
        vision = (images, examples.images) if images is not None else None
        result["samples_url"] = write_samples(model, first, spec, dist, pad_id, vision)
    if spec.config.eval.compare_base:
        del model  # one model in memory at a time
        from trainer.evaluation.base_model import base_figures

        beside_base(
            result, base_figures(spec, dist, lambda base: measure(base, objective, examples, spec, dist, tasks))
        )
    if dist.is_main:
        write_json_atomic(join(spec.run, layout.EVAL), result)
        log.info(objective.summary(result))
    return result


def task_index(spec: Spec) -> Any:
    """lm-evaluation-harness's index of eval.tasks' tasks, every name checked (None without eval.tasks)."""
    if not spec.config.eval.tasks.names:
        return None
    from config.lm_tasks import task_manager

    return task_manager(spec.config.eval.tasks)


def measure(
    model: torch.nn.Module,
    objective: TrainObjective[Any, Any, Any],
    examples: Split,
    spec: Spec,
    dist: Dist,
    tasks: Any = None,
) -> dict[str, Any]:
    """The objective's all-reduced metrics of `model` on the eval split, its generated answers' scores with
    eval.generate, and its benchmark tasks' metrics with eval.tasks (`tasks`: their index): what eval.json holds of
    the trained model and of the base model (eval.compare_base)."""
    remote = spec.config.model.trust_remote_code
    pad_id = ensure_pad_token_id(model, spec.model_path, trust_remote_code=remote)
    images = ImageInputs.of(spec.model_path, model_config(spec.model_path, trust_remote_code=remote))
    options = EvalOptions(spec.config.eval.batch_size, pad_id, images=images)
    metrics: dict[str, Any] = dict(objective.evaluate(model, examples, range(len(examples)), dist, options))
    if spec.config.eval.generate.enabled:
        metrics[GENERATE] = generate(model, examples, spec, dist, (pad_id, images))
    if tasks is not None:
        from transformers import AutoTokenizer

        from trainer.evaluation.lm_tasks import run_tasks

        trust = spec.config.model.trust_remote_code
        tokenizer = AutoTokenizer.from_pretrained(spec.model_path, trust_remote_code=trust)
        metrics |= run_tasks(model, tokenizer, spec.config.eval.tasks, tasks, dist, spec.config.train.seed)
    return dict(metrics)


def generate(
    model: torch.nn.Module, examples: Split, spec: Spec, dist: Dist, ids: tuple[int, ImageInputs | None]
) -> dict[str, Any]:
    """eval.json's `generate`: answers to the prompts of rows spread over the split, scored
    (trainer/evaluation/generate.py); `ids`: the pad id, and a vision-language model's image inputs (its prompts are
    answered with their images)."""
    from transformers import AutoTokenizer

    from trainer.evaluation.generate import generate_and_score, prompts_of

    pad_id, images = ids
    cfg = spec.config.eval.generate
    token = images.image_token if images is not None else -1
    prompts = prompts_of(examples, sample_rows(len(examples), cfg.max_records), cfg.max_records, token)
    tokenizer = AutoTokenizer.from_pretrained(spec.model_path, trust_remote_code=spec.config.model.trust_remote_code)
    vision = (images, examples.images) if images is not None else None
    return generate_and_score(model, prompts, cfg, dist, (pad_id, tokenizer), spec.config.train.seed, vision)


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
