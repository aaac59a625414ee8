"""Reading {run}/metrics.jsonl, the rank-0 log of steps and events (written by trainer/metrics.py; the format is
in docs/architecture.md)."""

from __future__ import annotations

import json
from typing import Any

from config.sections.results import (
    GENERATE_DIRECTION,
    PREFERENCE_METRICS,
    REWARD_SCORES,
    RL_METRICS,
    SFT_METRICS,
    TASK_METRICS,
    USER_SCORES,
)
from storage import layout
from storage.fs import exists, read_bytes
from storage.location import Location, join

# eval.json's counts beside its metrics: supervised (tokens) and preference (units: pairs or KTO answers) evaluation.
SFT_COUNTS = ("loss_sum", "target_tokens", "correct_tokens", "examples")
PREFERENCE_COUNTS = ("units",)
RL_COUNTS = ("records",)  # online RL (trainer/objectives/rl/evaluation.py): the eval prompts answered


def eval_metric_keys(result: dict[str, Any]) -> tuple[str, ...]:
    """The headline metrics of an eval.json (or a registry entry's metrics): a preference objective's when it has
    them (trainer/objectives/preference/), online RL's mean reward (trainer/objectives/rl/), else supervised
    evaluation's."""
    if "reward_accuracy" in result:
        return ("loss", *PREFERENCE_METRICS)
    return ("loss", *(RL_METRICS if "reward" in result else SFT_METRICS))


def eval_record_keys(result: dict[str, Any]) -> tuple[str, ...]:
    """The metrics and counts of an eval.json that a registry entry keeps."""
    if "reward_accuracy" in result:
        return (*eval_metric_keys(result), *PREFERENCE_COUNTS)
    return (*eval_metric_keys(result), *(RL_COUNTS if "reward" in result else SFT_COUNTS))


# eval.json's `generate` (eval.generate: trainer/evaluation/generate.py): its figures, and the answers shown to a
# person.
GENERATE = "generate"
SHOWN_ANSWERS = "answers"


# eval.json's benchmark tasks (eval.tasks: trainer/evaluation/lm_tasks.py): each task's metrics, {task: {metric:
# value}}, and
# how they were computed (the harness's version, samples, few-shot, standard errors, directions, seconds).
TASKS = "tasks"
TASKS_DETAIL = "tasks_detail"


def eval_record(result: dict[str, Any]) -> dict[str, Any]:
    """What a registry entry and the run's summary keep of an eval.json: the metrics and counts, the generated
    answers' figures (not the answers themselves) and the benchmark tasks'."""
    record = {key: result[key] for key in eval_record_keys(result)}
    if GENERATE in result:
        record[GENERATE] = {key: value for key, value in result[GENERATE].items() if key != SHOWN_ANSWERS}
    for key in (TASKS, TASKS_DETAIL):
        if key in result:
            record[key] = result[key]
    if BASE in result:
        record[BASE], record[DELTA] = eval_record(result[BASE]), result[DELTA]
    return record


# eval.json's base model figures (eval.compare_base: trainer/evaluation/base_model.py) and each metric's delta, trained
# minus base.
BASE = "base"
DELTA = "delta"


def metric_deltas(trained: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """eval.json's `delta`: trained minus base for each headline metric, each generated-answer score (exact match,
    ROUGE-L, tool calls, a user scorer's) and each benchmark task's metric that both have a value of, nested as in
    eval.json (generate.exact_match, tasks.arc_easy.acc)."""
    out: dict[str, Any] = {}
    for key in eval_metric_keys(trained):
        ours, theirs = metric_value(trained, key), metric_value(base, key)
        if ours is not None and theirs is not None:
            out[key] = ours - theirs
    ours_generated, theirs_generated = generate_metrics(trained), generate_metrics(base)
    ours_generated |= task_metrics(trained)
    theirs_generated |= task_metrics(base)
    for name, value in ours_generated.items():
        scored = name in GENERATE_DIRECTION or name.startswith((USER_SCORES, TASK_METRICS, REWARD_SCORES))
        if scored and name in theirs_generated:
            *parents, leaf = name.split(".")
            node = out
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value - theirs_generated[name]
    return out


def beside_base(result: dict[str, Any], base: dict[str, Any]) -> None:
    """Put the base model's figures into eval.json's `base` and trained minus base into `delta`; the base model's
    answer to each shown prompt goes beside the trained model's (`base_output`), not into `base` a second time."""
    result[DELTA] = metric_deltas(result, base)
    base = dict(base)
    if GENERATE in base:
        generated = dict(base[GENERATE])
        theirs = {answer["index"]: answer["output"] for answer in generated.pop(SHOWN_ANSWERS, [])}
        base[GENERATE] = generated
        for answer in result.get(GENERATE, {}).get(SHOWN_ANSWERS, []):
            answer["base_output"] = theirs.get(answer["index"], "")
    result[BASE] = base


def delta_metrics(result: dict[str, Any]) -> dict[str, float]:
    """An eval.json's (or a registry entry's) deltas as flat dotted names (delta.loss, delta.generate.exact_match);
    none without the base comparison."""

    def flat(prefix: str, node: dict[str, Any]) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, value in node.items():
            out |= flat(f"{prefix}.{key}", value) if isinstance(value, dict) else {f"{prefix}.{key}": float(value)}
        return out

    return flat(DELTA, result.get(DELTA, {}))


def generate_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The generated answers' figures of an eval.json or a registry entry's metrics as flat dotted names
    (generate.exact_match, generate.scores.<name>, online RL's generate.rewards.<name>), the ones with a value."""
    figures = {key: value for key, value in result.get(GENERATE, {}).items() if key != SHOWN_ANSWERS}
    flat = {f"{GENERATE}.{key}": value for key, value in figures.items() if key not in ("scores", "rewards")}
    flat |= {f"{GENERATE}.scores.{key}": value for key, value in figures.get("scores", {}).items()}
    flat |= {f"{REWARD_SCORES}{key}": value for key, value in figures.get("rewards", {}).items()}
    return {key: float(value) for key, value in flat.items() if isinstance(value, int | float)}


def task_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The benchmark tasks' metrics of an eval.json or a registry entry's metrics as flat dotted names
    (tasks.arc_easy.acc), the ones with a value."""
    return {
        f"{TASKS}.{task}.{metric}": float(value)
        for task, metrics in result.get(TASKS, {}).items()
        for metric, value in metrics.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


def metric_value(result: dict[str, Any], name: str) -> float | None:
    """The number at a dotted name of an eval.json or a registry entry's metrics (loss, generate.exact_match); None
    when it is absent or not a number (a tool-call rate without tool-call references)."""
    value: Any = result
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def read_metrics(run_url: Location) -> list[dict[str, Any]]:
    """Every record of {run}/metrics.jsonl (steps and events), in file order."""
    url = join(run_url, layout.METRICS)
    if not exists(url):
        return []
    return [json.loads(line) for line in read_bytes(url).decode().splitlines() if line.strip()]
