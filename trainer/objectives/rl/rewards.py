"""The built-in reward functions of online RL (train.rl.rewards: accuracy, format, tool_call), with TRL's signature:
`reward(prompts=, completions=, completion_ids=, **columns) -> list[float | None]`, a completion being TRL's
conversational form (`[{"role": "assistant", "content": text}]`) and the columns the records' other keys, one value per
completion. None says "not applicable to this completion" (TRL's convention: left out of the means).

- accuracy: the completion's final answer against the record's reference answer (`answer`, else `solution`): the
  content of the completion's last answer tag when it has one (train.rl.answer_tag), else the whole completion; the
  text after a `####` (GSM8K's marker) in either; compared with Hugging Face's math-verify (\\boxed{}, LaTeX, plain
  numbers: the completion's first boxed or LaTeX answer, else its last number) when the reference parses as math, else
  by SQuAD's normalised exact match. 1.0 or 0.0; None for a record without a reference answer.
- format: 1.0 when the completion is a reasoning block then an answer block in the configured tags
  (`<think>...</think>` then `<answer>...</answer>`, whitespace around them allowed), else 0.0.
- tool_call: 1.0 when the completion's tool calls (`<tool_call>` blocks) parse and equal the reference's (name and
  JSON-equal arguments; the reference from the record's `tool_calls`, OpenAI's list, else the `<tool_call>` blocks of
  its `answer`), else 0.0; None for a record without reference calls. The eval's own comparison
  (trainer/evaluation/scoring.py).

Torch-free: rewards are plain functions of text.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

from trainer.evaluation.scoring import normalize
from trainer.evaluation.scoring import tool_calls as parse_tool_calls

Completions = Sequence[Sequence[dict[str, Any]]]
RewardFunction = Callable[..., Sequence[float | None]]
GSM8K_MARK = "####"


def text_of(completion: Sequence[dict[str, Any]]) -> str:
    """A conversational completion's text."""
    return str(completion[0]["content"]) if completion else ""


def final_answer(text: str, answer_tag: str) -> str:
    """What a text gives as its final answer: its last answer block's content, then what follows a `####`."""
    blocks = re.findall(rf"<{answer_tag}>(.*?)</{answer_tag}>", text, re.DOTALL)
    if blocks:
        text = blocks[-1]
    if GSM8K_MARK in text:
        text = text.rsplit(GSM8K_MARK, 1)[1]
    return text.strip()


def reference_answer(answer: object, solution: object) -> str | None:
    """A record's reference answer as text: `answer`, else `solution` (TRL's accuracy_reward reads it); None without."""
    for value in (answer, solution):
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, str) and value.strip():
            return value
    return None


def _math(text: str, *, gold: bool) -> list[Any]:
    """math-verify's parse of a reference (as it is) or of a completion (boxed first, then LaTeX, then its numbers);
    without timeouts off the main thread (its timeouts use signal.alarm)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse
    from math_verify.parser import NormalizationConfig

    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    if gold:
        return list(parse(text, parsing_timeout=timeout))
    latex = LatexExtractionConfig(
        normalization_config=NormalizationConfig(units=True), boxed_match_priority=0, try_extract_without_anchor=False
    )
    configs = [latex, ExprExtractionConfig()]
    return list(parse(text, extraction_config=configs, extraction_mode="first_match", parsing_timeout=timeout))


def is_correct(completion: str, reference: str, answer_tag: str = "answer") -> bool:
    """Whether a completion's final answer equals the reference's (math-verify where the reference is math)."""
    from math_verify import verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout disabled" and parse warnings
    gold = _math(final_answer(reference, answer_tag), gold=True)
    said = final_answer(completion, answer_tag)
    if not gold:
        return bool(said) and normalize(said) == normalize(final_answer(reference, answer_tag))
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    return bool(verify(gold, _math(said, gold=False), timeout_seconds=timeout))


def accuracy_reward(answer_tag: str) -> RewardFunction:
    """The built-in `accuracy`, reading answers in `answer_tag`."""

    def accuracy(
        completions: Completions, answer: Sequence[object] = (), solution: Sequence[object] = (), **_: Any
    ) -> list[float | None]:
        answers = list(answer) or [None] * len(completions)
        solutions = list(solution) or [None] * len(completions)
        out: list[float | None] = []
        for completion, gold, worked in zip(completions, answers, solutions, strict=True):
            reference = reference_answer(gold, worked)
            out.append(None if reference is None else float(is_correct(text_of(completion), reference, answer_tag)))
        return out

    return accuracy


def format_reward(reasoning_tag: str, answer_tag: str) -> RewardFunction:
    """The built-in `format`: reasoning in `reasoning_tag`, then the answer in `answer_tag`."""
    r, a = re.escape(reasoning_tag), re.escape(answer_tag)
    pattern = re.compile(rf"^\s*<{r}>(?:(?!<{r}>).)*?</{r}>\s*<{a}>(?:(?!<{a}>).)*?</{a}>\s*$", re.DOTALL)

    def format(completions: Completions, **_: Any) -> list[float | None]:
        return [1.0 if pattern.match(text_of(completion)) else 0.0 for completion in completions]

    return format


def reference_calls(tool_calls_column: object, answer: object) -> list[tuple[Any, Any]] | None:
    """A record's reference tool calls: its `tool_calls` (OpenAI's list, or {name, arguments} objects), else the
    `<tool_call>` blocks of its `answer`; None when it has none."""
    if isinstance(tool_calls_column, list) and tool_calls_column:
        calls = []
        for call in tool_calls_column:
            function = call.get("function", call) if isinstance(call, dict) else {}
            arguments = function.get("arguments", {})
            if isinstance(arguments, str):
                arguments = json.loads(arguments) if arguments.strip() else {}
            calls.append((function.get("name"), arguments))
        return calls
    if isinstance(answer, str):
        return parse_tool_calls(answer) or None
    return None


def tool_call_reward() -> RewardFunction:
    """The built-in `tool_call`."""

    def tool_call(
        completions: Completions, tool_calls: Sequence[object] = (), answer: Sequence[object] = (), **_: Any
    ) -> list[float | None]:
        columns = list(tool_calls) or [None] * len(completions)
        answers = list(answer) or [None] * len(completions)
        out: list[float | None] = []
        for completion, column, gold in zip(completions, columns, answers, strict=True):
            expected = reference_calls(column, gold)
            if expected is None:
                out.append(None)
                continue
            out.append(float(parse_tool_calls(text_of(completion)) == expected))
        return out

    return tool_call


def builtin(name: str, reasoning_tag: str, answer_tag: str) -> RewardFunction:
    """A built-in reward by its name (config/rewards.py BUILTIN_REWARDS)."""
    if name == "accuracy":
        return accuracy_reward(answer_tag)
    if name == "format":
        return format_reward(reasoning_tag, answer_tag)
    assert name == "tool_call", f"no built-in reward {name}"
    return tool_call_reward()
