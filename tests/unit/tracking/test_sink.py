"""The sinks' common part (tracking/sink.py): what a metrics.jsonl line and the config become in every sink."""

from __future__ import annotations

from tracking.sink import step_metrics


def test_a_step_line_gives_its_train_metrics_and_skips_what_is_missing() -> None:
    line = {"step": 3, "max_steps": 8, "loss": 2.5, "lr": 0.001, "grad_norm": None, "tokens_per_s": 100}
    assert step_metrics(line) == {"train/loss": 2.5, "train/lr": 0.001, "train/tokens_per_s": 100.0}


def test_online_rls_step_metrics_are_mirrored_with_each_rewards() -> None:
    line = {"step": 1, "loss": 0.0, "reward": 0.5, "rewards/digits/mean": 0.25, "completions/clipped_ratio": 1.0,
            "clip_ratio/region_mean": 0.0, "kl": 0.01, "generation_s": 1.5, "scoring_s": 0.1}  # fmt: skip
    assert step_metrics(line) == {f"train/{key}": float(value) for key, value in line.items() if key != "step"}
