"""The model card (pipeline/model_card.py) as a reader sees it, for a registered entry built as the register task builds
it (pipeline/lineage.py): for an SFT LoRA run and a DPO full fine-tune, what it says the data and its held-out split,
the method and objective (with the reference model), the batch arithmetic, the chat template, the metrics the objective
measures (and none it does not), an elastic run's attempts and the lineage are, and how to load the model (PEFT only for
an adapter; a copy first from an object store). A password in any URL it shows is masked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from config.chat_template import builtin_template, template_digest
from core.checkout import code_version
from pipeline.lineage import registry_entry
from pipeline.model_card import load_snippet, model_card, split_row
from storage.checkpoints import CompleteCheckpoint
from storage.location import Location
from storage.metrics import beside_base
from storage.spec import Attempt, Spec
from tests.specs import spec_for

SFT_METRICS = {"loss": 2.0, "perplexity": 7.389, "token_accuracy": 0.5, "loss_sum": 200.0, "target_tokens": 100}
SFT_METRICS |= {"correct_tokens": 50, "examples": 10}
DPO_METRICS = {"loss": 0.6, "reward_accuracy": 0.75, "reward_margin": 0.5, "chosen_logps_per_token": -1.2}
DPO_METRICS |= {"rejected_logps_per_token": -1.5, "units": 8}
MANIFEST = {
    "splits": {"train": {"records": 90, "target_tokens": 900}, "eval": {"records": 10, "target_tokens": 100}},
    "split": {"eval_ratio": 0.1, "eval_max_records": 5, "eval_capped": 3},
}


def entry(spec: Spec, metrics: dict[str, Any]) -> dict[str, Any]:
    """A registry entry as register_version writes it (with the url the card reads back)."""
    checkpoint = CompleteCheckpoint(Location(f"{spec.run}/checkpoints/step-00000008"), 8, "ckpt-digest", {})
    measured = metrics | {"world_size": 2, "model_url": f"{spec.run}/final"}
    body = registry_entry(spec, "spec-digest", checkpoint, Location(f"{spec.run}/final"), measured, "flow-1")
    return body | {"model": "tandem-tiny", "version": 3, "created_at": "2025-01-02T03:04:05Z", "url": "/reg/v3.json"}


def table(card: str, section: str) -> dict[str, str]:
    """The rows of a section's two-column table."""
    body = card.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("| ").split(" | ", 1) for line in body.splitlines() if line.startswith("| ") and line != "| | |"]
    return dict(rows)


def test_an_sft_card_names_its_objective_batch_metrics_and_lineage(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, [])
    doc = entry(spec, SFT_METRICS)
    card = model_card(spec, doc, MANIFEST, None)
    assert card.startswith(f"# tandem-tiny v0003\n\nlora fine-tune of `{tmp_path}`, run `r`, registered 2025-01-02")
    assert table(card, "Data") == {
        "dataset": "`d`",
        "source": f"`{spec.config.data.source}`",
        "train split": "90 records, 900 target tokens",
        "eval split": "10 records, 100 target tokens",
        "held out": "`data.eval_ratio` 0.1, at most `data.eval_max_records` 5 (3 more records train)",
    }
    method = table(card, "Method and configuration")
    assert list(method)[:3] == ["method", "LoRA", "objective"]
    assert method["objective"] == "sft (supervised: cross-entropy of the answers)"
    assert method["LoRA"] == "r 16, alpha 32, dropout 0"
    assert method["global batch"] == "12 rows = 2 x 3 accumulation x 2 ranks"  # spec_for: 12 in 2s on 2 ranks
    assert (method["optimizer steps"], method["DeepSpeed"], method["nodes x ranks"]) == ("8", "ZeRO-2", "2 x 1")
    assert method["chat template"] == "the base model's own" and "attempts" not in method
    assert "All-reduced over 2 eval ranks" in card
    assert table(card, "Metrics") == {
        "eval loss (nats per target token)": "2.0000",
        "perplexity": "7.39",
        "token accuracy": "0.5000",
        "target tokens": "100",
        "correct tokens": "50",
        "eval examples": "10",
    }  # loss_sum is in the entry, not on the card
    assert table(card, "Lineage") == {key: f"`{value}`" for key, value in doc["lineage"].items()}
    assert table(card, "Lineage")["code_version"] == f"`{code_version()}`"
    assert "## Loss curve" not in card
    assert f'PeftModel.from_pretrained(base, "{spec.run}/final")' in card
    assert table(card, "Where")["checkpoint"] == f"`{spec.run}/checkpoints/step-00000008`"


def test_a_dpo_card_names_its_reference_template_attempts_and_preference_metrics(tmp_path: Path) -> None:
    spec = spec_for(
        tmp_path,
        ["train.objective=dpo", "train.method=full", "model.chat_template=qwen2.5", "launch.min_nnodes=1"],
    )
    spec = spec.model_copy(update={"attempts": [Attempt(number=1, nodes=[0], world_size=1, from_step=0)]})
    doc = entry(spec, DPO_METRICS)
    card = model_card(spec, doc, MANIFEST, Location(f"{spec.run}/loss.png"))
    assert "\n\nfull fine-tune of " in card
    method = table(card, "Method and configuration")
    assert "LoRA" not in method
    assert method["objective"] == (
        f"dpo (beta 0.1, label smoothing 0); reference: the base model `{tmp_path}`'s log-probabilities of every pair, "
        "computed before training (the run's reference/)"
    )
    digest = template_digest(builtin_template("qwen2.5"))[:16]
    assert method["chat template"] == f"`qwen2.5` (sha256 `{digest}`)"
    assert method["attempts"] == "attempt 1: nodes 0 (1 ranks) from step 0"
    assert table(card, "Metrics") == {
        "eval loss (nats per target token)": "0.6000",
        "reward accuracy (share of units the reward ranks right)": "0.7500",
        "reward margin (chosen minus rejected reward, mean)": "0.5000",
        "chosen log-probability per token": "-1.2000",
        "rejected log-probability per token": "-1.5000",
        "eval pairs (or KTO answers)": "8",
    }
    lineage = table(card, "Lineage")
    assert "attempts" in doc["lineage"] and "attempts" not in lineage  # shown once, in the configuration
    assert f"![loss curve](loss.png)\n\n`{spec.run}/loss.png`" in card
    assert "PeftModel" not in card and f'from_pretrained("{spec.run}/final", dtype=dtype)' in card


def test_the_split_row_the_snippet_from_an_object_store_and_masked_urls(tmp_path: Path) -> None:
    assert split_row({"eval_source": "/d/eval.jsonl"}) == ("held out", "`data.eval_source` /d/eval.jsonl, whole")
    assert split_row({"eval_ratio": 0.05}) == ("held out", "`data.eval_ratio` 0.05, no cap")
    assert split_row({"eval_ratio": 0.1, "eval_max_records": 50, "eval_capped": 0}) == (
        "held out",
        "`data.eval_ratio` 0.1, at most `data.eval_max_records` 50",
    )
    snippet = load_snippet({"model_url": "s3://b/runs/r/final", "method": "full"})
    assert snippet.splitlines()[0] == "# from_pretrained needs a local directory: copy s3://b/runs/r/final first " + (
        "(e.g. aws s3 sync)"
    )
    remote = load_snippet({"model_url": "/r/final", "base_model": "/m", "method": "lora", "trust_remote_code": True})
    assert remote.count("trust_remote_code=True") == 2  # the base and the tokenizer; PEFT loads the adapter on it
    assert "trust_remote_code" not in load_snippet({"model_url": "/r/final", "method": "full"})
    spec = spec_for(tmp_path, [])
    doc = entry(spec, SFT_METRICS) | {"url": "https://reader:hunter2@registry.example/v3.json"}
    card = model_card(spec, doc, MANIFEST, None)
    assert "hunter2" not in card and "https://reader:***@registry.example/v3.json" in card


GENERATED = {
    "records": 9,
    "exact_match": 0.25,
    "normalized_exact_match": 0.5,
    "rouge_l_f1": 0.61234,
    "tool_call_records": 0,
    "tool_call_parse_rate": None,
    "tool_call_accuracy": None,
    "scores": {"judge": 0.75},
    "new_tokens": 40,
    "max_new_tokens": 8,
    "temperature": 0.0,
    "seconds": 0.5,
    "answers": [
        {"index": 0, "prompt": "<|im_start|>user\nAdd | subtract?<|im_end|>\n", "reference": "a\nb", "output": "x"}
    ],
}


def test_an_sft_card_with_generated_answers_lists_their_figures_and_a_few_answers(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, ["eval.generate.enabled=true"])
    doc = entry(spec, SFT_METRICS | {"generate": GENERATED})
    assert "answers" not in doc["metrics"]["generate"]  # the registry keeps the figures, not the answers
    card = model_card(spec, doc, MANIFEST, None, answers=GENERATED["answers"])
    metrics = table(card, "Metrics")
    assert list(metrics)[6:] == [
        "answered eval prompts",
        "exact match",
        "normalised exact match (SQuAD)",
        "ROUGE-L F1",
        "answers that should call tools",
        "tokens generated",
        "generation seconds (slowest rank)",
        "score `judge` (eval.generate.scorer)",
    ]  # the tool-call rates have no value without tool-call references: not shown
    assert (metrics["ROUGE-L F1"], metrics["score `judge` (eval.generate.scorer)"]) == ("0.6123", "0.75")
    rows = card.split("\n## Sample answers\n", 1)[1].split("\n## ", 1)[0].splitlines()
    assert rows[-2:] == [
        "|---|---|---|---|",
        "| 0 | &lt;\\|im_start\\|>user ⏎ Add \\| subtract?&lt;\\|im_end\\|> | a ⏎ b | x |",
    ]


def test_with_the_base_model_the_card_lists_each_metrics_base_value_and_delta_and_both_answers(tmp_path: Path) -> None:
    """eval.compare_base: the Metrics rows carry the base model's value and trained minus base; the sample table has
    the base model's output beside the trained one's."""
    spec = spec_for(tmp_path, ["eval.generate.enabled=true", "eval.compare_base=true"])
    base = SFT_METRICS | {"loss": SFT_METRICS["loss"] + 0.5, "generate": GENERATED | {"exact_match": 0.125}}
    result = SFT_METRICS | {"generate": json.loads(json.dumps(GENERATED))}
    beside_base(result, json.loads(json.dumps(base)))
    card = model_card(spec, entry(spec, result), MANIFEST, None, answers=result["generate"]["answers"])
    metrics = table(card, "Metrics")
    loss = f"{SFT_METRICS['loss']:.4f}"
    assert metrics["eval loss (nats per target token)"] == f"{loss} (base {SFT_METRICS['loss'] + 0.5:.4f}, delta -0.5)"
    assert metrics["exact match"] == "0.25 (base 0.125, delta +0.125)"
    assert metrics["target tokens"] == "100"  # a count: no delta
    rows = card.split("\n## Sample answers\n", 1)[1].split("\n## ", 1)[0].splitlines()
    assert rows[-3].endswith("| output | base model's output |") and rows[-2] == "|---|---|---|---|---|"
    assert rows[-1].endswith("| a ⏎ b | x | x |")


def test_benchmark_tasks_are_card_rows_with_their_standard_error_and_the_base_beside_them(tmp_path: Path) -> None:
    """eval.tasks: the registry entry keeps `tasks` and `tasks_detail`; each task's metric is a Metrics row with its
    standard error, and with eval.compare_base the base model's value and the delta."""
    spec = spec_for(tmp_path, ["eval.tasks=[arc_easy, gsm8k]", "eval.compare_base=true"])
    detail = {
        "harness_version": "0.4.13",
        "seconds": 3.0,
        "limit": None,
        "apply_chat_template": False,
        "per_task": {
            "arc_easy": {"samples": 2376, "num_fewshot": 0, "stderr": {"acc": 0.0102}, "higher_is_better": {}},
            "gsm8k": {"samples": 1319, "num_fewshot": 5, "stderr": {}, "higher_is_better": {}},
        },
    }
    tasks = {"arc_easy": {"acc": 0.46}, "gsm8k": {"exact_match-strict-match": 0.125}}
    result = SFT_METRICS | {"tasks": tasks, "tasks_detail": detail}
    base = SFT_METRICS | {"tasks": {"arc_easy": {"acc": 0.44}, "gsm8k": {"exact_match-strict-match": 0.25}}}
    beside_base(result, base)
    doc = entry(spec, result)
    assert doc["metrics"]["tasks"] == tasks and doc["metrics"]["tasks_detail"] == detail
    assert doc["metrics"]["delta"]["tasks"]["arc_easy"]["acc"] == pytest.approx(0.02)
    metrics = table(model_card(spec, doc, MANIFEST, None), "Metrics")
    assert metrics["task `arc_easy`: acc"] == "0.4600 (base 0.4400, delta +0.02) ± 0.0102"
    assert metrics["task `gsm8k`: exact_match-strict-match"] == "0.1250 (base 0.2500, delta -0.125)"


def test_an_image_models_card_shows_its_images_and_loads_it_with_its_processor(tmp_path: Path) -> None:
    """A vision-language run: the data's images (how many, their tokens, where their digests are), each sample
    answer's images by name beside its prompt and answer, and the snippet's image-text class and image processor."""
    from tests.published_vision import QWEN25_VL_3B_INSTRUCT

    (tmp_path / "config.json").write_text(json.dumps(QWEN25_VL_3B_INSTRUCT))  # the base model's config.json
    spec = spec_for(tmp_path, [])
    splits = {split: {**c, "images": 3, "image_tokens": 48} for split, c in MANIFEST["splits"].items()}
    images = {"count": 6, "bytes": 4062, "patch_size": 14, "merge_size": 2, "min_pixels": 1024, "max_pixels": 589824}
    manifest = {**MANIFEST, "splits": splits, "images": images, "digest_algorithm": "blake3"}
    answers = [
        {
            "index": 0,
            "images": ["1.png", "2.png"],
            "prompt": "<image><image>Same shape?",
            "reference": "No.",
            "output": "No.",
        },
        {"index": 1, "prompt": "Hi", "reference": "Hello.", "output": "Hi."},
    ]
    card = model_card(spec, entry(spec, SFT_METRICS), manifest, None, answers=answers)
    assert table(card, "Data")["images"] == (
        "6 distinct (0.00 MB), 96 image tokens, at 1024-589824 pixels; each listed with its blake3 digest in the "
        "dataset's manifest (the lineage's dataset_manifest_digest)"
    )
    assert "| # | image | prompt (its end) | reference | output |" in card
    assert "| 0 | 1.png, 2.png | &lt;image>&lt;image>Same shape? | No. | No. |" in card and "| 1 |  | Hi |" in card
    snippet = load_snippet(entry(spec, SFT_METRICS))
    assert "base = AutoModelForImageTextToText.from_pretrained(" in snippet
    assert f'image_processor = AutoImageProcessor.from_pretrained("{spec.run}/final", backend="pil")' in snippet


def test_a_grpo_card_names_its_rewards_by_digest_its_reward_metrics_and_its_training(tmp_path: Path) -> None:
    reward = tmp_path / "reward.py"
    reward.write_text("def digits(completions, **kwargs):\n    return [0.0 for _ in completions]\n")
    spec = spec_for(tmp_path, ["train.objective=grpo", f"train.rl.rewards=[accuracy, {reward}:digits]",
                               "train.rl.reward_weights=[1, 0.5]", "train.global_batch_size=16"])  # fmt: skip
    digest = spec.rewards[1].digest or ""
    generated = {"records": 8, "reward": 0.75, "rewards": {"accuracy": 0.5, "digits": 0.5}, "answers": []}
    doc = entry(spec, {"loss": -0.75, "reward": 0.75, "records": 8, "generate": generated})
    steps = [{"step": s, "loss": 0.0, "reward": s / 10, "rewards/digits/mean": s / 20, "step_time_s": 2.0,
              "generation_s": 1.0, "entropy": 7.0} for s in range(1, 11)]  # fmt: skip
    prompts = {"splits": {"train": {"records": 9, "tokens": 90, "prompts": 9, "target_tokens": 0},
                          "eval": {"records": 1, "tokens": 10, "prompts": 1, "target_tokens": 0}},
               "split": MANIFEST["split"]}  # fmt: skip
    card = model_card(spec, doc, prompts, None, steps=steps)
    method = table(card, "Method and configuration")
    assert method["rewards"] == f"1 x `accuracy`; 0.5 x `{reward}:digits (sha256 {digest[:16]})`"
    assert method["objective"].startswith("grpo (group size 8, beta 0,") and "no reference model" in method["objective"]
    assert table(card, "Data")["train split"] == "9 records, 90 prompt tokens"
    metrics = table(card, "Metrics")
    assert metrics["eval loss (minus the mean reward)"] == "-0.7500"
    assert metrics["reward `digits` (train.rl.rewards), mean"] == "0.5"
    training = table(card, "Training")
    assert training["mean reward, first -> last 5 steps"] == "0.3000 -> 0.8000"
    assert training["reward `digits`, first -> last 5 steps"] == "0.1500 -> 0.4000"
    assert training["generation's share of the step time"] == "50%"
    assert doc["lineage"]["rewards"] == ["accuracy", f"{reward}:digits (sha256 {digest[:16]})"]
