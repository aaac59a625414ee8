"""What an over-long example keeps: whole later turns dropped first; a first turn too long alone cut at the prompt's
start and the answer's end by LLaMA-Factory's budget rule; a target always remains."""

from __future__ import annotations

from staging.length import budget_split, window


def test_an_example_that_fits_is_kept_whole() -> None:
    assert window(50, [(10, 20), (30, 50)], (10, 20), 50) == (0, 50)


def test_whole_later_turns_are_dropped_when_the_first_target_fits() -> None:
    turns = [(10, 20), (30, 40), (50, 70)]
    assert window(70, turns, (10, 20), 45) == (0, 40)  # ends after the last turn that ends within the limit
    assert window(70, turns, (10, 20), 39) == (0, 20)


def test_a_first_turn_too_long_alone_keeps_the_prompts_end_and_the_answers_start() -> None:
    start, stop = window(200, [(60, 200)], (60, 200), 100)  # prompt 60, answer 140, budget 100
    prompt, answer = budget_split(60, 140, 100)
    assert (start, stop) == (60 - prompt, 60 + answer) and prompt + answer == 100
    assert (prompt, answer) == (30, 70)  # neither below half the budget: proportional shares


def test_the_budget_rule() -> None:
    assert budget_split(80, 10, 50) == (40, 10)  # a short answer is kept whole, the prompt gets the rest
    assert budget_split(10, 80, 50) == (10, 40)  # a short prompt leaves the answer the rest
    assert budget_split(0, 80, 50) == (0, 50)  # plain text: a target with no prompt keeps its head
    assert budget_split(5, 5, 1) == (0, 1)  # a target always remains
    assert budget_split(5, 5, 2) == (1, 1)  # and the prompt one token, to predict the target's first token
