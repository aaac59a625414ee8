"""The generation service (trainer/model/generation.py) on the built-in tiny model: batched, left-padded answers equal
the answers each prompt gets alone, greedy and sampled (each answer's noise from its own seed), cut before the stop
token; sampling by the Gumbel-max trick draws from the temperature-scaled, top-p filtered distribution; a row's seed
is the same in every process."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT
from trainer.model.generation import Generator, GumbelSampler, Sampling, nucleus, row_seed


def tiny(path: str) -> tuple[object, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def prompts(tokenizer: object) -> list[list[int]]:
    texts = ["What is the capital of France?", "Hi", "Name three colours of the rainbow, please."]
    return [
        tokenizer(  # type: ignore[operator]
            tokenizer.apply_chat_template(  # type: ignore[attr-defined]
                [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )["input_ids"]
        for t in texts
    ]


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_batched_answers_equal_one_at_a_time(tiny_model: str, temperature: float) -> None:
    model, tokenizer = tiny(tiny_model)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id  # type: ignore[attr-defined]
    generator = Generator.of(model, tokenizer, pad)
    asked, sampling, seeds = prompts(tokenizer), Sampling(12, temperature), [row_seed(7, i) for i in range(3)]
    together = generator.generate(asked, sampling, seeds)
    alone = [generator.generate([p], sampling, [seed])[0] for p, seed in zip(asked, seeds, strict=True)]
    assert together == alone and all(0 < len(a) <= 12 for a in alone)
    assert not any(token in generator.stops for answer in alone for token in answer)  # cut before the stop token
    if temperature:
        others = generator.generate(asked, sampling, [row_seed(8, i) for i in range(3)])
        assert others != together  # another seed, other answers
        assert generator.generate(asked, sampling, seeds) == together  # the same seeds, the same answers


def test_gumbel_max_sampling_draws_from_the_filtered_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])
    sampling = Sampling(1, temperature=0.7, top_p=0.9)
    expected = torch.softmax(nucleus(torch.log_softmax(logits / 0.7, dim=-1), 0.9), dim=-1)[0]
    draws = 20_000
    sampler = GumbelSampler(sampling, [row_seed(1, k) for k in range(draws)])
    picked = sampler(torch.zeros(draws, 1, dtype=torch.long), logits.expand(draws, -1)).argmax(dim=-1)
    frequencies = torch.bincount(picked, minlength=5).double() / draws
    assert frequencies[expected == 0].sum() == 0  # outside the nucleus: never drawn
    assert torch.allclose(frequencies, expected.double(), atol=0.015), (frequencies, expected)


def test_the_nucleus_keeps_what_transformers_top_p_keeps() -> None:
    from transformers import TopPLogitsWarper

    torch.manual_seed(0)
    scores = torch.log_softmax(torch.randn(4, 50), dim=-1)
    for top_p in (0.1, 0.5, 0.95):
        ours = nucleus(scores, top_p)
        theirs = TopPLogitsWarper(top_p)(torch.zeros(4, 1, dtype=torch.long), scores.clone())
        assert torch.equal(torch.isinf(ours), torch.isinf(theirs)), top_p


def test_a_rows_seed_is_the_same_in_another_process() -> None:
    code = "from trainer.model.generation import row_seed; print(row_seed(42, 3, 1, 0))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert int(done.stdout) == row_seed(42, 3, 1, 0) and row_seed(42, 3, 1, 0) != row_seed(42, 3, 0, 1)


def test_a_completion_keeps_its_stop_token_and_says_whether_it_ended(tiny_model: str) -> None:
    """What rollouts take (`complete`): the stop token kept (the model learns to stop), `ended` False for a completion
    that ran out of tokens; `generate` is the same tokens without it. With the model whole on every rank
    (`whole_weights`, a plain model here: no gathering), each generates alone, in eval mode, and the mode comes back."""
    from trainer.model.generation import whole_weights

    model, tokenizer = tiny(tiny_model)
    model.train()
    pad = tokenizer.pad_token_id  # type: ignore[attr-defined]
    with whole_weights(model, zero3=False) as module:
        assert not module.training
        generator = Generator.of(module, tokenizer, pad)
        asked, seeds = prompts(tokenizer), [row_seed(3, i) for i in range(3)]
        done = generator.complete(asked, Sampling(40, 1.5), seeds)
        plain = generator.generate(asked, Sampling(40, 1.5), seeds)
    assert model.training
    for completion, answer in zip(done, plain, strict=True):
        if completion.ended:
            assert completion.ids[-1] in generator.stops and completion.ids[:-1] == answer
        else:
            assert len(completion.ids) == 40 and completion.ids == answer
