"""What becomes of the trained model: `eval` (how it is evaluated), `register` with its `register.gate` (whether and
under which name it is registered; the metrics' directions and the champion's metric), and `track` (where metrics,
parameters and models are mirrored: MLflow, TensorBoard, W&B).

Together because they all act on the finished training's results, after the nodes are done.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator, model_validator

from config.sections.base import Section
from core.redact import has_url_password


class GenerateConfig(Section):
    """Answers generated for the eval split's prompts and scored against its references (docs/evaluation.md)."""

    enabled: bool = Field(
        False,
        description="Generate an answer to each eval prompt (the conversation up to its last assistant turn) and score "
        "it: exact match, normalised exact match, ROUGE-L F1, tool calls, eval.generate.scorer; into eval.json's "
        "`generate`.",
    )
    max_records: int = Field(
        200,
        gt=0,
        description="At most this many eval examples are answered, from rows spread evenly over the split: "
        "generation costs a forward pass per new token, so this bounds the stage's time.",
    )
    max_new_tokens: int = Field(128, gt=0, le=8192, description="Tokens generated per answer at most.")
    batch_size: int = Field(
        8, gt=0, description="Prompts generated together (left-padded, with the KV cache); also the unit of sharding."
    )
    temperature: float = Field(
        0.0,
        ge=0.0,
        description="0: greedy decoding, the same answers whatever the number of ranks; above 0: sampling, seeded by "
        "train.seed and the batch.",
    )
    scorer: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="Your own scores, `module:function` importable on every node: called as function(prompt=, "
        "reference=, output=) per answer, it returns a dict of float scores, averaged over the answers into "
        "eval.json's generate.scores.",
    )


class TasksConfig(Section):
    """Benchmark tasks of lm-evaluation-harness run on the model under evaluation (docs/evaluation.md)."""

    names: list[str] = Field(
        default_factory=list,
        description="lm-evaluation-harness task or group names (arc_easy, hellaswag, mmlu, or your own from "
        "eval.tasks.include_path); empty: no benchmark tasks. Needs the `tasks` extra on every node "
        "(pip install 'tandem[tasks]') and each task's data local or in the Hugging Face cache of every node. "
        "`eval.tasks: [arc_easy]` is short for `eval.tasks.names: [arc_easy]`.",
    )
    include_path: str | None = Field(
        None,
        min_length=1,
        description="A directory of your own task YAML files (lm-evaluation-harness's --include_path), at this path "
        "on every node, with the data files they name; its files are in the base model cache's key.",
    )
    num_fewshot: int | None = Field(
        None, ge=0, le=64, description="Few-shot examples per prompt; empty: each task's own default."
    )
    limit: int | None = Field(
        None,
        gt=0,
        description="At most this many documents per task (the first ones): bounds the stage's time; empty: every "
        "document, as published scores are computed.",
    )
    batch_size: int = Field(8, gt=0, description="Requests per forward pass on each rank.")
    apply_chat_template: bool = Field(
        False, description="Render each prompt with the model's chat template (for chat and instruction models)."
    )
    bootstrap_iters: int = Field(
        1000,
        ge=0,
        description="Resamples for the standard errors of metrics without a closed form (lm-evaluation-harness's "
        "default is 100000, minutes on one process for some tasks); 0: no standard errors.",
    )

    @field_validator("names")
    @classmethod
    def _distinct(cls, names: list[str]) -> list[str]:
        if len(set(names)) != len(names) or not all(name.strip() == name and name for name in names):
            raise ValueError(f"eval.tasks.names must be distinct task names without spaces around them, got {names}")
        return names


class EvalConfig(Section):
    """Evaluation of the trained model on the eval split."""

    batch_size: int = Field(8, gt=0, description="Examples per rank per forward pass.")
    model: Literal["final", "checkpoint"] = Field(
        "final",
        description="What the pipeline evaluates: the exported final/ model, or the final complete checkpoint "
        "(DeepSpeed shards, reassembled on the base model).",
    )
    generate_samples: int = Field(
        0, ge=0, le=1000, description="Write this many greedy completions of eval prompts to {run}/samples.jsonl."
    )
    max_new_tokens: int = Field(32, gt=0, le=4096, description="Tokens generated per sample (eval.generate_samples).")
    generate: GenerateConfig = Field(
        default_factory=GenerateConfig, description="Generated answers scored against the references."
    )
    compare_base: bool = Field(
        False,
        description="Evaluate the base model (model.name_or_path, untrained) the same way, once per base model, eval "
        "data and evaluation settings (cached under run.storage's eval-cache/base/); eval.json gets its figures "
        "under `base` and trained minus base under `delta` (register.gate can use delta.<metric>). Off by default: "
        "the first run of a base and data pays a second evaluation, and with eval.generate a second generation.",
    )
    tasks: TasksConfig = Field(
        default_factory=TasksConfig,
        description="Benchmark tasks (lm-evaluation-harness) run on the evaluated model (and the base model with "
        "eval.compare_base), their requests shared across the ranks; into eval.json's `tasks`.",
    )
    final_eval_rows: int = Field(
        256,
        ge=0,
        description="Rows of the eval split, spread evenly over it, that the trainer evaluates its in-memory model on "
        "after the last step (metrics.jsonl's final_eval: what the exported model must reproduce on the same rows); "
        "0: the whole split. A wrong export changes the loss of nearly every token, far beyond the agreement (about "
        "1e-5) of a right one, so a few hundred rows catch it.",
    )

    @field_validator("tasks", mode="before")
    @classmethod
    def _task_list(cls, value: object) -> object:
        return {"names": value} if isinstance(value, list | tuple) else value  # eval.tasks: [arc_easy] is short


Metric = Literal[
    "loss",
    "perplexity",
    "token_accuracy",
    "reward_accuracy",
    "reward_margin",
    "chosen_logps_per_token",
    "rejected_logps_per_token",
    "reward",
]
# Which way each metric improves; a gate pointing the other way would promote worse models.
METRIC_DIRECTION: dict[str, str] = {
    "loss": "min",
    "perplexity": "min",
    "token_accuracy": "max",
    "reward_accuracy": "max",
    "reward_margin": "max",
    "chosen_logps_per_token": "max",
    "rejected_logps_per_token": "min",
    "reward": "max",
}
# The metrics of supervised evaluation alone, and of preference evaluation alone (train.objective); loss is both's.
SFT_METRICS: tuple[Metric, ...] = ("perplexity", "token_accuracy")
PREFERENCE_METRICS: tuple[Metric, ...] = (
    "reward_accuracy",
    "reward_margin",
    "chosen_logps_per_token",
    "rejected_logps_per_token",
)
# Online RL's (train.objective=grpo): the mean total reward of the eval prompts' generated answers (its eval `loss` is
# minus it, so that lower is better there too).
RL_METRICS: tuple[Metric, ...] = ("reward",)
# How the champion is chosen when register.gate is not set.
CHAMPION_METRIC: Metric = "loss"


# The generated answers' figures a gate may compare (eval.json's generate: config/sections/results.py GenerateConfig),
# and which way each improves; a user scorer's (generate.scores.<name>) take the direction the gate gives.
GENERATE_DIRECTION: dict[str, str] = {
    "generate.exact_match": "max",
    "generate.normalized_exact_match": "max",
    "generate.rouge_l_f1": "max",
    "generate.tool_call_parse_rate": "max",
    "generate.tool_call_accuracy": "max",
    "generate.reward": "max",
}
USER_SCORES = "generate.scores."
# Online RL's reward functions' means over the eval answers (train.rl.rewards): generate.rewards.<name>, higher better.
REWARD_SCORES = "generate.rewards."
# A benchmark task's metric (eval.tasks): tasks.<task>.<metric>, its direction the gate's (each task has its own).
TASK_METRICS = "tasks."
# A metric's delta against the base model (eval.compare_base): delta.<metric>, improving the metric's own way.
DELTA_PREFIX = "delta."


def is_task_metric(name: str) -> bool:
    """tasks.<task>.<metric>: a benchmark task's metric (eval.tasks) as eval.json nests it."""
    parts = name.split(".")
    return len(parts) == 3 and parts[0] == TASK_METRICS.rstrip(".") and all(parts[1:])


class GateConfig(Section):
    """Promotion gate: register only when an eval metric passes a bound or beats the champion."""

    metric: str = Field(
        "loss",
        description="Eval metric the gate compares (and the champion is ranked by): an eval.json key, dotted for the "
        f"generated answers' ({', '.join(GENERATE_DIRECTION)}, {USER_SCORES}<name> for eval.generate.scorer's); "
        f"{TASK_METRICS}<task>.<metric> for a benchmark task's (eval.tasks, e.g. {TASK_METRICS}arc_easy.acc); "
        f"{REWARD_SCORES}<name> for a reward function's mean over the eval answers (train.objective=grpo); "
        f"{DELTA_PREFIX}<metric> for trained minus base (eval.compare_base), e.g. {DELTA_PREFIX}generate.exact_match.",
    )
    direction: Literal["min", "max"] | None = Field(
        None,
        description="min: lower is better; max: higher is better; empty: the metric's own (loss min, accuracies "
        f"max); required for {USER_SCORES}<name> and {TASK_METRICS}<task>.<metric>.",
    )
    threshold: float | None = Field(
        None, description="Pass when the metric is at most (min) or at least (max) this value."
    )
    min: float | None = Field(None, description="Pass when the metric is at least this value (with max: a range).")
    max: float | None = Field(None, description="Pass when the metric is at most this value.")
    better_than: Literal["champion"] | None = Field(
        None, description="champion: pass only when strictly better than the current champion (or none exists)."
    )

    @model_validator(mode="after")
    def _one_rule(self) -> GateConfig:
        rules = [self.threshold is not None, self.better_than is not None, self.min is not None or self.max is not None]
        if sum(rules) != 1:
            raise ValueError("set exactly one rule in register.gate: threshold, better_than, or min and/or max")
        known = {**METRIC_DIRECTION, **GENERATE_DIRECTION}
        name = self.metric.removeprefix(DELTA_PREFIX)  # a delta improves the way its metric does
        if name.startswith(REWARD_SCORES) and len(name) > len(REWARD_SCORES):
            known[name] = "max"  # a reward (train.rl.rewards) improves upwards, whichever it is
        own = (name.startswith(USER_SCORES) and len(name) > len(USER_SCORES)) or is_task_metric(name)
        if name not in known and not own:
            raise ValueError(
                f"register.gate.metric={self.metric} is not an eval.json metric; use one of {', '.join(known)}, "
                f"{USER_SCORES}<name> (eval.generate.scorer's), {TASK_METRICS}<task>.<metric> (eval.tasks'), or "
                f"{DELTA_PREFIX}<one of those> (eval.compare_base)"
            )
        if self.direction is None:
            if own:
                raise ValueError(
                    f"register.gate.direction: set min or max for {self.metric} (which way it improves is the "
                    "scorer's or the task's)"
                )
            object.__setattr__(self, "direction", known[name])  # sections are frozen: filled in once here
        elif not own and self.direction != known[name]:
            raise ValueError(f"register.gate.direction must be {known[name]} for {self.metric}, got {self.direction}")
        return self


class RegisterConfig(Section):
    """Where the trained model is registered, and the gate it must pass."""

    model_name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$",
        description="Registry name (also the MLflow model's and the model card's); versions are "
        "registry/{model_name}/v0001.json, v0002.json, ...; empty: the model's directory or hub name, lowercased "
        "(Qwen/Qwen2.5-0.5B-Instruct: qwen2.5-0.5b-instruct), tandem-tiny for the built-in tiny model.",
    )
    gate: GateConfig | None = Field(None, description="Promotion gate; empty: every evaluated model is registered.")


MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"
TRACKING_OFF = "off"


class TrackConfig(Section):
    """Where the run's metrics, parameters and models are mirrored: MLflow, TensorBoard, Weights & Biases.

    Tandem's own files (metrics.jsonl, the registry) stay the source of truth; the pipeline process forwards them."""

    mlflow_uri: str | None = Field(
        None,
        description=f"MLflow tracking server (http://host:5000) or store URI; empty: ${MLFLOW_URI_ENV} when set, "
        f"else no MLflow; {TRACKING_OFF}: no MLflow even when ${MLFLOW_URI_ENV} is set. Credentials come from "
        "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD, never from here.",
        min_length=1,
    )
    mlflow_experiment: str = Field(
        "tandem", min_length=1, max_length=500, description="MLflow experiment the run is logged to (created if new)."
    )
    tensorboard: bool = Field(False, description="Write TensorBoard event files under {run}/tensorboard/.")
    wandb: bool = Field(False, description="Log to Weights & Biases (WANDB_API_KEY / WANDB_MODE from the environment).")
    wandb_project: str = Field("tandem", min_length=1, max_length=128, description="W&B project of the run.")

    @field_validator("mlflow_uri", mode="before")
    @classmethod
    def _no_url_password(cls, value: object) -> object:
        if value is False:  # `--set track.mlflow_uri=off` is YAML, where a bare off is false
            return TRACKING_OFF
        if isinstance(value, str) and has_url_password(value):
            raise ValueError(
                "track.mlflow_uri has a password in its URL: remove it and set MLFLOW_TRACKING_USERNAME "
                "and MLFLOW_TRACKING_PASSWORD in the environment instead"
            )
        return value

    def mlflow_tracking_uri(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The MLflow URI this run logs to, or None when MLflow is off (the rule of track.mlflow_uri)."""
        if self.mlflow_uri == TRACKING_OFF:
            return None
        if self.mlflow_uri is not None:
            return self.mlflow_uri
        return (os.environ if environ is None else environ).get(MLFLOW_URI_ENV) or None
