"""The built-in rewards (trainer/objectives/rl/rewards.py) with TRL's signature: accuracy against GSM8K's `#### N`,
OpenR1-Math's `solution` (math-verify: \\boxed{}, LaTeX, plain numbers) and plain text; format's tags; tool_call's
comparison; None where a reward does not apply."""

from __future__ import annotations

from trainer.objectives.rl.rewards import builtin, final_answer


def conversation(*texts: str) -> list[list[dict[str, str]]]:
    return [[{"role": "assistant", "content": text}] for text in texts]


def test_accuracy_reads_gsm8k_answers_boxed_latex_and_answer_tags() -> None:
    accuracy = builtin("accuracy", "think", "answer")
    gold = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"
    completions = conversation(
        "So the answer is \\boxed{72}.", "#### 72", "<think>48+24</think><answer>72</answer>", "It is $71$.", "no idea"
    )
    assert accuracy(completions, answer=[gold] * 5) == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_accuracy_reads_trls_solution_column_and_compares_fractions_as_math() -> None:
    accuracy = builtin("accuracy", "think", "answer")
    completions = conversation("The result is \\boxed{\\frac{2}{6}}", "\\boxed{\\frac{1}{2}}")
    assert accuracy(completions, solution=["$\\frac{1}{3}$"] * 2) == [1.0, 0.0]


def test_accuracy_of_a_text_answer_is_its_normalised_exact_match_and_none_without_a_reference() -> None:
    accuracy = builtin("accuracy", "think", "answer")
    assert accuracy(conversation("<answer>The Paris.</answer>", "Lyon"), answer=["paris", None]) == [1.0, None]


def test_format_wants_reasoning_then_answer_in_the_configured_tags() -> None:
    reward = builtin("format", "reasoning", "final")
    completions = conversation(
        "<reasoning>a</reasoning>\n<final>b</final>", "<final>b</final>", "x <reasoning>a</reasoning><final>b</final>"
    )
    assert reward(completions) == [1.0, 0.0, 0.0]


def test_tool_call_compares_names_and_arguments_with_the_records_calls() -> None:
    reward = builtin("tool_call", "think", "answer")
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    openai = [{"type": "function", "function": {"name": "add", "arguments": '{"b": 2, "a": 1}'}}]
    completions = conversation(call, call.replace("1", "5"), "no call")
    assert reward(completions, tool_calls=[openai] * 3) == [1.0, 0.0, 0.0]
    assert reward(conversation(call, call), answer=[call, "plain"]) == [1.0, None]


def test_the_final_answer_is_the_last_answer_block_then_what_follows_the_marker() -> None:
    assert final_answer("<answer>1</answer> <answer>x #### 2</answer>", "answer") == "2"
