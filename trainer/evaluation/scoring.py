"""Scores of one generated answer against its reference (`eval.generate`), and their sums over many answers.

Every score is a number per answer that is summed, with a count, and divided once after the sums of every rank are
added (trainer/evaluation/generate.py): exact match, normalised exact match (SQuAD's normalisation), ROUGE-L F1 (the
longest
common subsequence of words, written here: on ASCII text rouge-score's tokenisation without stemming and equal to
its F1, which tests/unit/trainer/evaluation/test_scoring.py checks; other scripts' letters are words too), and for an
answer
whose reference calls tools, whether the output's calls parse and equal the reference's (name and JSON-equal
arguments).
A user's scorer (`eval.generate.scorer`) adds its own scores. docs/evaluation.md says what each one means.
"""

from __future__ import annotations

import importlib
import json
import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.errors import UserError

# The block the chat templates Tandem ships render an assistant's tool call as (config/templates/qwen2.5.jinja).
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
TOOL_CALL_OPEN = "<tool_call>"
ARTICLES = re.compile(r"\b(a|an|the)\b")
PUNCTUATION = str.maketrans("", "", string.punctuation)
# The sums every rank keeps, in this order (a user scorer's (sum, count) pairs follow them), and the three of them
# that are a mean over every answer.
SUMS = (
    "records",
    "exact_match",
    "normalized_exact_match",
    "rouge_l_f1",
    "tool_call_records",
    "tool_call_parsed",
    "tool_call_correct",
)
MEANS = SUMS[1:4]

Scorer = Callable[..., dict[str, float]]


def normalize(text: str) -> str:
    """SQuAD's answer normalisation: lowercase, punctuation and the articles a/an/the removed, whitespace collapsed."""
    return " ".join(ARTICLES.sub(" ", text.lower().translate(PUNCTUATION)).split())


# Chinese and Japanese write no spaces between words, so each ideograph or kana is a word of its own (what Chinese
# ROUGE evaluations do); any other run of letters or digits, in any script, is one word. On ASCII text this is
# exactly rouge-score's tokeniser (lowercase runs of a-z0-9), which drops every other letter: Qwen's users answer in
# Chinese, and an identical Chinese answer scoring 0 would make the figure useless there.
CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
WORD = re.compile(f"[{CJK}]|[^\\W_{CJK}]+")


def words(text: str) -> list[str]:
    """ROUGE's words: each Chinese or Japanese character, and every other run of letters or digits, lowercased."""
    return WORD.findall(text.lower())


def lcs_length(a: list[str], b: list[str]) -> int:
    """Length of the longest common subsequence of two word lists (one row of the table at a time)."""
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def rouge_l_f1(output: str, reference: str) -> float:
    """ROUGE-L F1 of the output against the reference (0 when either has no words, as rouge-score gives)."""
    out, ref = words(output), words(reference)
    common = lcs_length(out, ref) if out and ref else 0
    if common == 0:
        return 0.0
    precision, recall = common / len(out), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def tool_calls(text: str) -> list[tuple[str, Any]] | None:
    """The (name, arguments) of every <tool_call> block in `text`, in order; None when a block does not parse (not
    JSON, no name, arguments not an object or a JSON string of one, or a block left open), [] when there is none."""
    blocks = TOOL_CALL.findall(text)
    if len(blocks) != text.count(TOOL_CALL_OPEN):
        return None
    calls = []
    for block in blocks:
        try:
            call = json.loads(block)
            arguments = call.get("arguments", {}) if isinstance(call, dict) else None
            if isinstance(arguments, str):
                arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(arguments, dict):
            return None
        calls.append((call["name"], arguments))
    return calls


@dataclass
class Sums:
    """Sums of the scores of the answers one rank scored; `user` maps a user score to its (sum, count)."""

    values: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SUMS, 0.0))
    user: dict[str, tuple[float, int]] = field(default_factory=dict)

    def add(self, prompt: str, reference: str, output: str, scorer: Scorer | None) -> dict[str, float]:
        """Score one answer into the sums; its own scores."""
        scores = {
            "exact_match": float(output.strip() == reference.strip()),
            "normalized_exact_match": float(normalize(output) == normalize(reference)),
            "rouge_l_f1": rouge_l_f1(output, reference),
        }
        expected = tool_calls(reference)
        if expected:
            got = tool_calls(output)
            scores["tool_call_parsed"] = float(bool(got))
            scores["tool_call_correct"] = float(got == expected)
        self.values["records"] += 1
        self.values["tool_call_records"] += bool(expected)
        for key, value in scores.items():
            self.values[key] += value
        for key, value in user_scores(scorer, prompt, reference, output).items():
            total, count = self.user.get(key, (0.0, 0))
            self.user[key] = (total + value, count + 1)
            scores[f"scores.{key}"] = value
        return scores


def figures(values: dict[str, float], user: dict[str, tuple[float, int]]) -> dict[str, Any]:
    """The metrics of summed counts (every rank's added): each a sum divided once by its count."""
    records, calls = values["records"], values["tool_call_records"]
    return {
        "records": int(records),
        **{key: values[key] / records if records else None for key in MEANS},
        "tool_call_records": int(calls),
        "tool_call_parse_rate": values["tool_call_parsed"] / calls if calls else None,
        "tool_call_accuracy": values["tool_call_correct"] / calls if calls else None,
        "scores": {key: total / count for key, (total, count) in sorted(user.items()) if count},
    }


def load_scorer(path: str | None) -> Scorer | None:
    """The function `eval.generate.scorer` names (`module:function`), or None when it is not set."""
    if path is None:
        return None
    module_name, _, name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(
            f"eval.generate.scorer={path}: cannot import {module_name} ({exc}); install it on every node or fix the "
            "module path"
        ) from None
    function = getattr(module, name, None)
    if not callable(function):
        raise UserError(f"eval.generate.scorer={path}: {module_name} has no function {name}; fix the function name")
    return function


def user_scores(scorer: Scorer | None, prompt: str, reference: str, output: str) -> dict[str, float]:
    """The user scorer's scores of one answer, checked to be a dict of numbers."""
    if scorer is None:
        return {}
    scores: Any = scorer(prompt=prompt, reference=reference, output=output)
    if not isinstance(scores, dict) or not all(
        isinstance(key, str) and isinstance(value, int | float) and not isinstance(value, bool)
        for key, value in scores.items()
    ):
        raise UserError(
            f"eval.generate.scorer: {getattr(scorer, '__name__', scorer)} returned {scores!r:.80}; it must return a "
            "dict of score names to numbers"
        )
    return {key: float(value) for key, value in scores.items()}
