"""The base model beside the trained one (`eval.compare_base`): the same evaluation of model.name_or_path, untrained
and without an adapter, computed once and cached.

The ranks evaluate the base after the trained model, with the same code and the same all-reduce, so the base figures
are exact across ranks too. The result is cached under run.storage at eval-cache/base/{key}.json (storage/layout.py),
outside any run's directory, so every later run of the same base model, eval data and evaluation settings reads it
instead of loading the base: the key is the sha256 of the base model's manifest digest (spec.json's
model_manifest_digest, the sha256 of base_model.json), the staged dataset's manifest digest (spec.json's
dataset.manifest_digest) and the settings that change the figures (`cache_inputs`). Rank 0 reads the cache and every
rank takes its answer, so the ranks agree on a hit even while another run writes the file (atomically).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from config.sections.results import TasksConfig
from storage import layout
from storage.digest import digest_bytes
from storage.fs import exists, read_json, write_json_atomic
from storage.location import Location
from storage.spec import Spec
from trainer.parallel.distributed import Dist, gather_objects

log = logging.getLogger(__name__)


def cache_inputs(spec: Spec) -> dict[str, Any] | None:
    """What the base model's figures depend on: the base model's and the eval data's digests, the objective and the
    evaluation settings; None when the spec has no base model digest (a spec written before it existed: no cache)."""
    if spec.model_manifest_digest is None:
        return None
    cfg = spec.config
    generate = cfg.eval.generate
    preference = cfg.train.objective.data.preference_rows
    inputs = {
        "base_model_manifest_digest": spec.model_manifest_digest,
        "dataset_manifest_digest": spec.dataset.manifest_digest,
        "objective": cfg.train.objective.name,
        "preference": cfg.train.preference.model_dump(mode="json") if preference else None,
        "eval_batch_size": cfg.eval.batch_size,  # padding changes the float sums' order, by about 1e-7
        "generate": generate.model_dump(mode="json") if generate.enabled else None,
        "seed": cfg.train.seed if generate.enabled and generate.temperature > 0 else None,
    }
    if spec.rewards:  # online RL: its evaluation generates and scores with the run's rewards (their files by digest)
        rl = cfg.train.rl.model_dump(mode="json", include={"max_completion_length", "top_p", "reward_weights"})
        rl |= {"rewards": [ref.describe() for ref in spec.rewards], "generate": generate.model_dump()}
        inputs["rl"] = {**rl, "tags": [cfg.train.rl.reasoning_tag, cfg.train.rl.answer_tag]}
        inputs["seed"] = cfg.train.seed if generate.temperature > 0 else None
    if cfg.eval.tasks.names:  # only then: the keys of caches written before eval.tasks existed stay the same
        inputs["tasks"] = tasks_inputs(cfg.eval.tasks, cfg.train.seed)
    return inputs


def tasks_inputs(cfg: TasksConfig, seed: int) -> dict[str, Any]:
    """What the benchmark tasks' figures depend on: the settings, the harness's version (its tasks change between
    releases), your task files' digest (eval.tasks.include_path) and the seed (few-shot examples)."""
    from config.lm_tasks import harness_version, include_digest

    settings = cfg.model_dump(mode="json", exclude={"include_path"})
    return {**settings, "harness_version": harness_version(), "include_digest": include_digest(cfg), "seed": seed}


def cache_key(inputs: dict[str, Any]) -> str:
    """The sha256 of the inputs' canonical JSON: the cache file's name."""
    return digest_bytes(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode(), "sha256")


def cache_url(spec: Spec) -> tuple[Location, dict[str, Any]] | None:
    """(where the base model's figures for this spec are cached, the inputs they are keyed by); None: not cached."""
    inputs = cache_inputs(spec)
    if inputs is None:
        return None
    return layout.base_eval_url(layout.root(spec.config.run), cache_key(inputs)), inputs


def read_cached(url: Location, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """The cached figures at `url` when they are for these inputs; None when absent or unreadable (evaluated again)."""
    if not exists(url):
        return None
    try:
        doc = read_json(url)
    except ValueError as exc:
        log.warning("base model evaluation cache %s is unreadable (%s): evaluating the base again", url, exc)
        return None
    if doc.get("schema") != layout.BASE_EVAL_SCHEMA or doc.get("inputs") != inputs:
        return None
    figures = doc.get("figures")
    return figures if isinstance(figures, dict) else None


def base_figures(spec: Spec, dist: Dist, measure: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """The base model's figures, `measure` (the trained model's evaluation) applied to it, from the cache when a run
    of the same base, data and settings computed them; computed and cached otherwise."""
    cached = cache_url(spec)
    found = read_cached(*cached) if cached is not None and dist.is_main else None
    figures = gather_objects(found, dist)[0]  # rank 0's answer: every rank takes the same branch
    where = cached[0] if cached is not None else "no base model digest in spec.json: not cached"
    if figures is not None:
        log.info("base model evaluation: cache hit, %s", where)
        return figures
    log.info("base model evaluation: cache miss, evaluating %s (%s)", spec.model_path, where)
    figures = measure(load_base_for_eval(spec, dist))
    if cached is not None and dist.is_main:
        url, inputs = cached
        write_json_atomic(url, {"schema": layout.BASE_EVAL_SCHEMA, "inputs": inputs, "figures": figures})
    return figures


def load_base_for_eval(spec: Spec, dist: Dist) -> Any:
    """model.name_or_path as `from_pretrained` loads it (a vision-language model's own class), in the evaluation's
    dtype and eval mode: no adapter."""
    from trainer.evaluation.load import eval_dtype
    from trainer.model.load import auto_class, model_config

    remote = spec.config.model.trust_remote_code
    auto = auto_class(model_config(spec.model_path, trust_remote_code=remote))
    model: Any = auto.from_pretrained(spec.model_path, dtype=eval_dtype(dist.device), trust_remote_code=remote)
    return model.to(dist.device).eval()
