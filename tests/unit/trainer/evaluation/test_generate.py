"""trainer/evaluation/generate.py without ranks: the prompt and reference cut from a staged example (its last assistant
turn), batches that are the same on any number of ranks, and the answers of the generation service
(trainer/model/generation.py) on the built-in tiny model scored (the 1-and-3-rank proof is
tests/distributed/test_evaluate.py)."""

from __future__ import annotations

import torch

from config.sections.results import GenerateConfig
from storage.shards import IGNORE_INDEX, Row, row
from trainer.evaluation.generate import batches_of, generate_and_score, last_turn, prompts_of
from trainer.model.generation import Generator, Sampling
from trainer.parallel.distributed import Dist

X = IGNORE_INDEX
ONE = Dist(0, 0, 1, 0, "host", torch.device("cpu"))


def test_the_reference_is_the_last_assistant_turn() -> None:
    # system+user (masked), answer 1 (targets 5 6), user (masked), answer 2 (targets 9 10)
    example = row([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [X, X, X, X, 5, 6, X, X, 9, 10, X])
    assert last_turn(example) == ([1, 2, 3, 4, 5, 6, 7, 8], [9, 10])
    assert last_turn(row([1, 2, 3, 4], [1, 2, 3, 4])) == ([1, 2], [3, 4])  # plain text: cut in half
    assert last_turn(row([1, 2], [X, X])) is None


def test_prompts_come_from_the_given_rows_examples_up_to_the_cap() -> None:
    packed = Row([1, 2, 3, 4, 5, 6], [X, 2, X, X, 5, 6], [2, 4])  # two examples in one row
    split = [row([7, 8], [X, 8]), packed, row([9], [X])]
    assert prompts_of(split, [1, 2, 0], 10) == [(0, [1], [2], ()), (1, [3, 4], [5, 6], ()), (2, [7], [8], ())]
    assert len(prompts_of(split, [1, 2, 0], 2)) == 2


def test_batches_are_ordered_by_length_whatever_the_ranks() -> None:
    prompts = [(i, [0] * length, [1], ()) for i, length in enumerate([5, 2, 9, 2, 7])]
    assert [[p[0] for p in batch] for batch in batches_of(prompts, 2)] == [[1, 3], [0, 4], [2]]


def tiny(path: str) -> tuple[object, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def test_the_answers_are_scored_in_prompt_order_with_their_cost(tiny_model) -> None:
    model, tokenizer = tiny(tiny_model)
    texts = ["What is the capital of France?", "Hi", "Name three colours of the rainbow, please."]
    rendered = [
        tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
        for t in texts
    ]
    prompts = [
        (i, tokenizer(text, add_special_tokens=False)["input_ids"], [5, 6], ()) for i, text in enumerate(rendered)
    ]
    cfg = GenerateConfig(enabled=True, max_new_tokens=6, batch_size=2)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    alone = [Generator.of(model, tokenizer, pad).generate([p[1]], Sampling(6), [0])[0] for p in prompts]
    result = generate_and_score(model, prompts, cfg, ONE, (pad, tokenizer))
    assert result["records"] == 3 and result["new_tokens"] == sum(map(len, alone))
    assert [a["index"] for a in result["answers"]] == [0, 1, 2]
    assert [a["output"] for a in result["answers"]] == tokenizer.batch_decode(alone, skip_special_tokens=True)
    assert result["tool_call_records"] == 0 and result["tool_call_accuracy"] is None and result["seconds"] > 0
