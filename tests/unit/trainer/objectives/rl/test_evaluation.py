"""GRPO's evaluation (trainer/objectives/rl/evaluation.py): an answer to each eval prompt, greedy, scored by the run's
reward functions: eval.json's reward and its minus as the loss, each function's mean under generate.rewards, the
answers shown; the same on 2 ranks as on 1 (the sums all-reduced; marker multirun)."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.split_reader import Split
from tests.gloo import on_ranks
from tests.unit.trainer.objectives.rl.conftest import load_policy, started, write_prompts
from trainer.objectives.base import EvalOptions
from trainer.parallel.distributed import Dist

ONE = Dist(rank=0, local_rank=0, world_size=1, node_rank=0, host="test", device=__import__("torch").device("cpu"))


def evaluate(dist: Dist, model_dir: str, rows: Split) -> dict:
    grpo = started(model_dir, {"num_generations": 2})
    options = EvalOptions(4, grpo.runtime.pad_id)
    return grpo.evaluate(load_policy(model_dir).eval(), rows, range(len(rows)), dist, options)


def test_the_answers_are_scored_by_the_rewards(tiny_model: str, prompts: Split) -> None:
    result = evaluate(ONE, tiny_model, prompts)
    generated = result["generate"]
    assert result["loss"] == -result["reward"] and result["records"] == generated["records"] == len(prompts)
    assert set(generated["rewards"]) == {"accuracy", "chars"} and generated["rewards"]["accuracy"] == 0.0
    assert result["reward"] == pytest.approx(generated["rewards"]["chars"]) and result["objective"] == "grpo"
    assert [a["index"] for a in generated["answers"]] == list(range(5))
    assert generated["answers"][0]["reference"] == "3" and generated["truncated_share"] <= 1.0
    assert started(tiny_model, {}).summary(result).startswith("eval grpo reward ")


def on_a_rank(dist: Dist, model_dir: str, folder: str) -> dict:
    return evaluate(dist, model_dir, write_prompts(model_dir, Path(folder) / f"rank-{dist.rank}"))


@pytest.mark.multirun  # 2 ranks loading a model: about 40 s on the busy 2-core machine (the default run has one)
def test_two_ranks_give_one_ranks_figures(tiny_model: str, prompts: Split, tmp_path: Path) -> None:
    one = evaluate(ONE, tiny_model, prompts)
    for result in on_ranks(on_a_rank, 2, tiny_model, str(tmp_path)):
        assert result["reward"] == pytest.approx(one["reward"], rel=1e-9)
        assert result["generate"]["answers"] == one["generate"]["answers"]
