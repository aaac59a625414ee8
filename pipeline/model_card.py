"""The model card (markdown): data, method, config highlights, metrics, lineage, and how to load it.

Plain functions: the register task publishes the card as a Prefect artifact and writes it to
{run}/model_card.md; the registry CLI prints the loading snippet of `load_snippet`.
"""

from __future__ import annotations

from typing import Any

from config.chat_template import template_digest
from config.deepspeed import zero_stage
from config.footprint import read_model_json
from config.methods import LORA, METHODS
from config.vision import is_vision_language
from core.redact import mask_text
from storage import layout
from storage.adapters import AdapterSummary
from storage.location import Location
from storage.metrics import BASE, DELTA, TASKS_DETAIL, generate_metrics, metric_value, task_metrics
from storage.spec import Spec

METRIC_ROWS = (
    ("loss", "eval loss (nats per target token)", "{:.4f}"),
    ("perplexity", "perplexity", "{:.2f}"),
    ("token_accuracy", "token accuracy", "{:.4f}"),
    ("target_tokens", "target tokens", "{}"),
    ("correct_tokens", "correct tokens", "{}"),
    ("examples", "eval examples", "{}"),
    ("reward_accuracy", "reward accuracy (share of units the reward ranks right)", "{:.4f}"),
    ("reward_margin", "reward margin (chosen minus rejected reward, mean)", "{:.4f}"),
    ("chosen_logps_per_token", "chosen log-probability per token", "{:.4f}"),
    ("rejected_logps_per_token", "rejected log-probability per token", "{:.4f}"),
    ("units", "eval pairs (or KTO answers)", "{}"),
    ("reward", "mean reward of the eval answers (train.rl.rewards, weighted)", "{:.4f}"),
)
RL_LOSS = "eval loss (minus the mean reward)"  # online RL's eval loss (trainer/objectives/rl/evaluation.py)

# eval.generate's figures (storage/metrics.py generate_metrics names them), in this order; a user scorer's follow.
GENERATE_ROWS = {
    "generate.records": "answered eval prompts",
    "generate.exact_match": "exact match",
    "generate.normalized_exact_match": "normalised exact match (SQuAD)",
    "generate.rouge_l_f1": "ROUGE-L F1",
    "generate.tool_call_records": "answers that should call tools",
    "generate.tool_call_parse_rate": "tool calls that parse",
    "generate.tool_call_accuracy": "tool calls equal to the reference's",
    "generate.new_tokens": "tokens generated",
    "generate.seconds": "generation seconds (slowest rank)",
    "generate.reward": "mean reward of the answers",
    "generate.completion_length": "answer length (tokens)",
    "generate.truncated_share": "answers that ran out of tokens",
}
REWARD_SCORE = "generate.rewards."  # online RL: each reward function's mean over the eval answers
# Online RL's training figures on the card (metrics.jsonl), each the mean over the first and the last steps.
TRAINING_ROWS = (
    ("reward", "mean reward"),
    ("frac_reward_zero_std", "groups without reward spread"),
    ("completions/mean_length", "completion length (tokens)"),
    ("completions/clipped_ratio", "completions truncated"),
    ("kl", "KL to the reference"),
    ("entropy", "entropy (nats per token)"),
    ("clip_ratio/region_mean", "tokens clipped"),
)
EDGE_STEPS = 5


def generate_rows(metrics: dict[str, Any]) -> list[tuple[str, str]]:
    """The card's rows of the generated answers' figures (none when eval.generate was off)."""
    figures = generate_metrics(metrics)
    own = [key for key in figures if key.startswith(("generate.scores.", REWARD_SCORE))]

    def label(key: str) -> str:
        if key.startswith(REWARD_SCORE):
            return f"reward `{key.removeprefix(REWARD_SCORE)}` (train.rl.rewards), mean"
        return GENERATE_ROWS.get(key, f"score `{key.removeprefix('generate.scores.')}` (eval.generate.scorer)")

    return [
        (label(key), with_base(metrics, key, "{:.4g}", figures[key]))
        for key in [*(key for key in GENERATE_ROWS if key in figures), *own]
    ]


def training_rows(steps: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Online RL's training figures (metrics.jsonl's step lines): each one's mean over the first and the last
    EDGE_STEPS steps, each reward function's too, and the share of the step time spent generating (none for other
    objectives)."""
    steps = [r for r in steps if "event" not in r and r.get("reward") is not None]
    if not steps:
        return []
    first, last = steps[:EDGE_STEPS], steps[-EDGE_STEPS:]

    def mean(records: list[dict[str, Any]], key: str) -> float:
        return sum(float(r[key]) for r in records) / len(records)

    keys = [(key, label) for key, label in TRAINING_ROWS if key in steps[0]]
    keys += [(k, f"reward `{k.split('/')[1]}`") for k in steps[0] if k.startswith("rewards/") and k.endswith("/mean")]
    rows = [(f"{label}, first -> last {len(last)} steps", f"{mean(first, k):.4f} -> {mean(last, k):.4f}")
            for k, label in keys]  # fmt: skip
    share = sum(r.get("generation_s", 0.0) for r in steps) / max(sum(r["step_time_s"] for r in steps), 1e-9)
    return [*rows, ("generation's share of the step time", f"{share:.0%}")]


def task_rows(metrics: dict[str, Any]) -> list[tuple[str, str]]:
    """The card's rows of the benchmark tasks' metrics (eval.tasks), each with its standard error when the harness gave
    one, and the base model's and the delta beside it (none without eval.tasks)."""
    per_task = metrics.get(TASKS_DETAIL, {}).get("per_task", {})
    rows = []
    for key, value in task_metrics(metrics).items():
        _, task, metric = key.split(".")
        stderr = per_task.get(task, {}).get("stderr", {}).get(metric)
        shown = with_base(metrics, key, "{:.4f}", value)
        rows.append((f"task `{task}`: {metric}", shown if stderr is None else f"{shown} ± {stderr:.4f}"))
    return rows


def with_base(metrics: dict[str, Any], key: str, fmt: str, value: Any) -> str:
    """A metric's value, and with eval.compare_base the base model's and the delta (trained minus base) beside it."""
    text = fmt.format(value)
    base, delta = metric_value(metrics, f"{BASE}.{key}"), metric_value(metrics, f"{DELTA}.{key}")
    return text if base is None or delta is None else f"{text} (base {fmt.format(base)}, delta {delta:+.4g})"


def metric_rows(metrics: dict[str, Any]) -> list[tuple[str, str]]:
    """The card's rows of the objective's metrics and counts, each metric with the base model's and the delta beside
    it (eval.compare_base)."""
    rl = "reward" in metrics and "reward_accuracy" not in metrics

    def label(key: str, text: str) -> str:
        return RL_LOSS if rl and key == "loss" else text

    return [
        (label(key, text), with_base(metrics, key, fmt, metrics[key]))
        for key, text, fmt in METRIC_ROWS
        if key in metrics
    ]


def metrics_intro(spec: Spec, metrics: dict[str, Any], world_size: int) -> str:
    """The line above the Metrics table: how they were reduced, and what stands beside them with eval.compare_base."""
    base = (
        f"; beside each, the base model `{spec.model_path}` and the delta (trained minus base)"
        if DELTA in metrics
        else ""
    )
    return f"All-reduced over {world_size} eval ranks (sums divided once){base}."


def answers_table(answers: list[dict[str, Any]]) -> str:
    """A markdown table of generated answers (eval.json's generate.answers): each prompt's end, its reference and the
    model's output, and the base model's beside it with eval.compare_base; one line per cell (a newline shown as an
    arrow; pipes and tags escaped so that they show); an image prompt's images by name in a column of their own."""

    def cell(text: str) -> str:
        text = text.strip().replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace("\r", "")
        return text.replace("\n", " ⏎ ")

    both = any("base_output" in a for a in answers)
    images = any(a.get("images") for a in answers)
    columns = (*(("images",) if images else ()), "prompt", "reference", "output", *(("base_output",) if both else ()))
    shown = [{**a, "images": ", ".join(a.get("images", []))} for a in answers]
    rows = [f"| {a['index']} | " + " | ".join(cell(a.get(c, "")) for c in columns) + " |" for a in shown]
    header = (
        "| # |"
        + (" image |" if images else "")
        + " prompt (its end) | reference | output |"
        + (" base model's output |" if both else "")
    )
    return "\n".join([header, "|---" * (len(columns) + 1) + "|", *rows])


def answers_section(answers: list[dict[str, Any]] | None) -> list[str]:
    """The card's Sample answers section (nothing when eval.generate was off)."""
    return (
        ["## Sample answers", "Answers to eval prompts (`eval.generate`).", answers_table(answers)] if answers else []
    )


def load_snippet(entry: dict[str, Any]) -> str:
    """Python that loads a registered model with transformers (+ PEFT for an adapter); a vision-language model (its
    base model's config.json, where it is readable) with AutoModelForImageTextToText and its image processor (the PIL
    backend: no torchvision needed)."""
    model_url = entry["model_url"]
    vision = is_vision_language(read_model_json(str(entry.get("base_model") or "")) or {})
    auto = "AutoModelForImageTextToText" if vision else "AutoModelForCausalLM"
    # The precision Tandem evaluates in on a CPU, so that the snippet reproduces the recorded metrics there; without
    # it, transformers takes the checkpoint's own dtype (bf16 for most published models).
    lines = [
        "import torch",
        f"from transformers import {'AutoImageProcessor, ' if vision else ''}{auto}, AutoTokenizer",
        "",
        "dtype = torch.float32  # as Tandem evaluated on a CPU; torch.bfloat16 on a GPU",
    ]
    # A model trained with model.trust_remote_code loads with its own code, as it trained.
    remote = ", trust_remote_code=True" if entry.get("trust_remote_code") else ""
    method = METHODS.get(entry.get("method", LORA.name))  # an entry that names no method: an adapter
    if method is not None and method.trains_adapters:
        lines[1:1] = ["from peft import PeftModel"]
        lines += [
            f'base = {auto}.from_pretrained("{entry["base_model"]}", dtype=dtype{remote})',
            f'model = PeftModel.from_pretrained(base, "{model_url}")  # .merge_and_unload() for plain weights',
        ]
    else:
        lines += [f'model = {auto}.from_pretrained("{model_url}", dtype=dtype{remote})']
    lines += [f'tokenizer = AutoTokenizer.from_pretrained("{model_url}"{remote})']
    if vision:
        lines += [f'image_processor = AutoImageProcessor.from_pretrained("{model_url}", backend="pil")']
    if "://" in model_url:
        lines[0:0] = [f"# from_pretrained needs a local directory: copy {model_url} first (e.g. aws s3 sync)"]
    return "\n".join(lines)


def _table(rows: list[tuple[str, Any]]) -> str:
    return "\n".join(["| | |", "|---|---|", *(f"| {key} | {value} |" for key, value in rows)])


def chat_template_row(spec: Spec) -> str:
    """Which chat template the model was trained with (and its export carries)."""
    if spec.chat_template is None:
        return "the base model's own"
    return f"`{spec.config.model.chat_template}` (sha256 `{template_digest(spec.chat_template)[:16]}`)"


def config_highlights(spec: Spec) -> list[tuple[str, Any]]:
    """The settings a reader needs to judge the model."""
    cfg, train = spec.config, spec.config.train
    rows: list[tuple[str, Any]] = [
        ("method", train.method),
        ("objective", objective_row(spec)),
        (
            "base model",
            f"`{spec.model_path}`"
            + (
                f" (files: base_model.json, sha256 `{spec.model_manifest_digest[:16]}`)"
                if spec.model_manifest_digest
                else ""
            ),
        ),
        ("optimizer steps", spec.total_steps),
        ("global batch", cfg.batch_text(spec.world_size)),
        ("learning rate", f"{train.learning_rate:g} ({train.lr_scheduler}, warmup {train.warmup_ratio:g})"),
        ("max length", cfg.data.max_length),
        ("chat template", chat_template_row(spec)),
        (
            "reasoning / history",
            f"enable_thinking {str(cfg.data.enable_thinking).lower()}, "
            f"mask_history {str(cfg.data.mask_history).lower()}",
        ),
        ("DeepSpeed", f"ZeRO-{zero_stage(spec.deepspeed)}"),
        ("nodes x ranks", f"{cfg.launch.nnodes} x {cfg.launch.nproc_per_node}"),
    ]
    if spec.rewards:  # online RL: the reward functions, a file's by the digest of its staged copy
        rows.insert(2, ("rewards", "; ".join(rewards_text(spec))))
    if spec.attempts:  # an elastic run: each launch's nodes, world size and starting step
        rows.append(("attempts", "; ".join(a.describe() for a in spec.attempts)))
    if train.method.trains_adapters:
        rows.insert(1, ("LoRA", f"r {train.lora.r}, alpha {train.lora.alpha}, dropout {train.lora.dropout:g}"))
    return rows


def objective_row(spec: Spec) -> str:
    """The training objective, its settings and its reference model, as the objective describes itself."""
    train = spec.config.train
    return train.objective.card(train.objective.settings_of(train), train.method, spec.model_path)


def rewards_text(spec: Spec) -> list[str]:
    """Each reward function (weight, name, a file's sha256) of an online RL run."""
    weights = spec.config.train.rl.weights
    return [f"{weight:g} x `{ref.describe()}`" for weight, ref in zip(weights, spec.rewards, strict=True)]


def split_row(split: dict[str, Any]) -> tuple[str, str]:
    """How the eval split was made (the dataset manifest's `split`): the eval source, or the ratio and its cap."""
    if "eval_source" in split:
        return "held out", f"`data.eval_source` {split['eval_source']}, whole"
    ratio = f"`data.eval_ratio` {split['eval_ratio']:g}"
    cap = split.get("eval_max_records")  # absent from manifests staged before the cap existed
    if cap is None:
        return "held out", f"{ratio}, no cap"
    moved = split.get("eval_capped", 0)
    return "held out", f"{ratio}, at most `data.eval_max_records` {cap}" + (
        f" ({moved} more records train)" if moved else ""
    )


def images_rows(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """The card's row of a dataset's images: how many, their bytes and tokens, and where their digests are (none for
    a dataset without images)."""
    images = manifest.get("images")
    if not images:
        return []
    tokens = sum(c.get("image_tokens", 0) for c in manifest["splits"].values())
    return [
        (
            "images",
            (
                f"{images['count']} distinct ({images['bytes'] / 1e6:.2f} MB), {tokens} image tokens, at "
                f"{images['min_pixels']}-{images['max_pixels']} pixels; each listed with its "
                f"{manifest['digest_algorithm']} digest in the dataset's manifest (the lineage's "
                "dataset_manifest_digest)"
            ),
        )
    ]


def data_rows(spec: Spec, lineage: dict[str, Any], manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """The card's Data rows: the dataset, its source, each split's records (prompts: their tokens; else the target
    tokens) and how the eval split was made, and its images (if any)."""
    rows = [("dataset", f"`{lineage['dataset_id']}`"), ("source", f"`{spec.config.data.source}`")]
    for split, c in manifest["splits"].items():
        tokens = f"{c['tokens']} prompt tokens" if "prompts" in c else f"{c['target_tokens']} target tokens"
        rows.append((f"{split} split", f"{c['records']} records, {tokens}"))
    return [*rows, split_row(manifest["split"]), *images_rows(manifest)]


def model_card(
    spec: Spec,
    entry: dict[str, Any],
    manifest: dict[str, Any],
    loss_plot: Location | None,
    adapters: AdapterSummary | None = None,
    answers: list[dict[str, Any]] | None = None,
    steps: list[dict[str, Any]] | None = None,
) -> str:
    """The whole card for a registered version (`manifest`: the staged dataset's; `adapters`: what a LoRA run
    adapted, from its export; `answers`: a few generated answers, eval.json's generate.answers; `steps`: metrics.jsonl's
    records, whose online RL figures get a Training section)."""
    metrics, lineage = entry["metrics"], entry["lineage"]
    title = f"{entry['model']} v{entry['version']:04d}"
    parts = [
        f"# {title}",
        f"{spec.config.train.method} fine-tune of `{spec.model_path}`, run `{spec.run_id}`, "
        f"registered {entry['created_at']}.",
        "## Data",
        _table(data_rows(spec, lineage, manifest)),
        "## Method and configuration",
        _table(config_highlights(spec) + ([("adapters", adapters.describe())] if adapters else [])),
        "## Metrics",
        metrics_intro(spec, metrics, lineage["world_size"]),
        _table(metric_rows(metrics) + generate_rows(metrics) + task_rows(metrics)),
        *answers_section(answers),
    ]
    if training := training_rows(steps or []):
        parts += ["## Training", "Online RL's step metrics (metrics.jsonl).", _table(training)]
    if loss_plot:
        parts += ["## Loss curve", f"![loss curve]({layout.LOSS_PLOT})", f"`{loss_plot}`"]
    parts += [
        "## Lineage",
        _table([(key, f"`{value}`") for key, value in lineage.items() if key != "attempts"]),
        "## How to load",
        f"```python\n{load_snippet(entry)}\n```",
        "## Where",
        _table(
            [
                ("model", f"`{entry['model_url']}`"),
                ("checkpoint", f"`{entry['checkpoint_url']}`"),
                ("registry entry", f"`{entry['url']}`"),
            ]
        ),
    ]
    # A source URL or path may carry a password (https://user:pass@host/...): the card is published and kept.
    return mask_text("\n\n".join(parts) + "\n")
