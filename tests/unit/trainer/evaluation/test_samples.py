"""Greedy samples of eval prompts: a prompt is the tokens before the first target and its reference that first
answer (plain text: its first half and the rest); the samples spread over the ranks and written in order by rank 0."""

from __future__ import annotations

import json

import torch

from storage.shards import IGNORE_INDEX, Row
from tests.specs import spec_for
from trainer.evaluation.samples import greedy, split_prompt, write_samples
from trainer.model import tiny
from trainer.parallel.distributed import Dist

N = IGNORE_INDEX


def test_the_prompt_is_what_comes_before_the_first_answer() -> None:
    assert split_prompt(Row([1, 2, 3, 4, 5, 6], [N, N, 3, 4, N, 6], [6])) == ([1, 2], [3, 4])
    assert split_prompt(Row([1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [5])) == ([1, 2], [3, 4, 5])  # plain text: halves


def test_samples_are_the_models_greedy_completions_in_order(tmp_path, tiny_model) -> None:
    spec = spec_for(tmp_path, ["eval.generate_samples=2", "eval.max_new_tokens=5"])
    spec = spec.model_copy(update={"model_path": tiny_model})
    torch.manual_seed(0)
    model = tiny.build_model(tiny.RECIPE["vocab_size"], pad_id=0, eos_id=1).eval()
    examples = [Row([5, 6, 7, 8, 9], [N, N, N, 8, 9], [5]), Row([10, 11, 12], [N, 11, 12], [3]), Row([1], [1], [1])]
    one = Dist(0, 0, 1, 0, "host", torch.device("cpu"))
    url = write_samples(model, examples, spec, one, pad_id=0)
    rows = [json.loads(line) for line in (tmp_path / "runs" / "r" / "samples.jsonl").read_text().splitlines()]
    assert url == str(tmp_path / "runs" / "r" / "samples.jsonl") and [row["index"] for row in rows] == [0, 1]
    assert rows[0]["schema"] == "tandem.samples/1"
    expected = greedy(model, [5, 6, 7], 5, 0, torch.device("cpu"))
    assert rows[0]["completion_ids"] == expected and 0 < len(expected) <= 5
    none = spec.model_copy(
        update={
            "config": spec.config.model_copy(
                update={"eval": spec.config.eval.model_copy(update={"generate_samples": 0})}
            )
        }
    )
    assert write_samples(model, examples, none, one, pad_id=0) is None
