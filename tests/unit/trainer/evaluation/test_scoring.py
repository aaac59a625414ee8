"""trainer/evaluation/scoring.py: each score of a generated answer pinned on hand-written cases, ROUGE-L F1 equal to
Google's
rouge-score package (the reference implementation) on varied pairs (given our words where a text has letters
outside ASCII), their sums divided once, and the user scorer's
refusals (one line naming eval.generate.scorer)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.errors import UserError
from trainer.evaluation.scoring import Sums, figures, lcs_length, load_scorer, normalize, rouge_l_f1, tool_calls, words


def call(name: str, arguments: dict | str) -> str:
    """A tool call as the shipped chat template renders it."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def output_length(prompt: str, reference: str, output: str) -> dict[str, float]:
    """A user scorer: the output's length in words, and whether the prompt was seen."""
    return {"words": len(output.split()), "saw_prompt": float(bool(prompt))}


def test_normalize_is_squads() -> None:
    assert normalize("  The Eiffel   Tower, an icon!") == "eiffel tower icon"
    assert normalize("A") == ""


@pytest.mark.parametrize(
    ("output", "reference", "expected"),
    [
        ("the cat sat on the mat", "the cat is on the mat", 5 / 6),  # LCS 5 of 6 words each way
        ("a b c d", "A, c!", 2 / 3),  # P 2/4, R 2/2
        ("eiffel tower", "The Eiffel Tower.", 0.8),  # P 1, R 2/3
        ("x y", "z", 0.0),
        ("", "", 0.0),  # no words: 0, as rouge-score gives
    ],
)
def test_rouge_l_f1(output: str, reference: str, expected: float) -> None:
    assert rouge_l_f1(output, reference) == pytest.approx(expected, rel=1e-12)


# Pairs (output, reference) of the kinds generated answers come in. On ASCII text rouge-score's tokens are lowercase
# runs of [a-z0-9] (no stemming by default), and ours are the same; the pairs with letters outside ASCII are where ours
# differ on purpose (rouge-score drops those letters, so an identical Chinese answer scores 0 there), and there the
# LCS and F1 are still rouge-score's, given our words (docs/evaluation.md says so).
REFERENCE_PAIRS = [
    ("The cat sat on the mat.", "the cat is on the mat"),
    ("Paris", "Paris"),
    ("paris", "PARIS!"),
    ("It's 42.", "it is 42"),  # an apostrophe splits: it s 42
    ("e-mail me at bob@example.com", "email bob at example dot com"),
    ("3.14159 is pi", "pi is about 3.14"),
    ("the the the the", "the"),  # repeats: LCS 1, precision 1/4
    ("the", "the the the the"),
    ("a b a b a b", "b a b a"),
    ("", "a reference"),  # empty output
    ("an output", ""),  # empty reference
    ("   \n\t ", "   "),
    ("!!! ??? ...", "..."),  # punctuation only: no words
    ("café naïve résumé", "cafe naive resume"),  # accents stay in their word: no match
    ("café", "café"),
    ("İstanbul", "istanbul"),  # "İ".lower() is i + a combining dot, which is no letter: i / stanbul
    ("STRASSE", "straße"),  # lower() keeps ß: strasse against straße
    ("北京是中国的首都", "北京是中国的首都"),  # a word a character: 1 (rouge-score alone: 0)
    ("Москва — столица", "Москва столица"),
    ("answer: 北京 (Beijing)", "Beijing"),
    ("👍 yes", "yes 👍"),
    ("x1 y2 z3", "X1, Y2; Z3"),
    ("snake_case and camelCase", "snake case and camelcase"),
    ('{"name": "add", "arguments": {"a": 1}}', '{"arguments": {"a": 1}, "name": "add"}'),
    ("<tool_call>\n{}\n</tool_call>", "tool call"),
    ("Tabs\tand\nnewlines", "tabs and newlines"),
    ("running runs ran", "run running"),  # no stemming: only "running" matches
    ("1,000,000 dollars", "1000000 dollars"),
    ("no overlap at all", "completely different words here"),
    ("one two three four five", "five four three two one"),  # reversed: LCS 1
    (
        " ".join(f"w{i % 37} filler" for i in range(300)),
        " ".join(f"w{(i * 7) % 41} filler" for i in range(250)),
    ),  # long answers: 600 and 500 words
    ("The quick brown fox jumps over the lazy dog. " * 20, "A quick brown dog jumps over the lazy fox. " * 15),
]


class OurWords:
    """Our tokeniser in the form rouge-score's scorer takes one."""

    def tokenize(self, text: str) -> list[str]:
        return words(text)


@pytest.fixture(scope="module")
def reference_rouge() -> tuple[Any, Any]:
    """rouge-score's scorer with its own tokeniser and with ours, imported here rather than at collection: it imports
    nltk, which imports scikit-learn and SciPy (about 4 s), and only the worker that runs these tests should pay."""
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"]), rouge_scorer.RougeScorer(["rougeL"], tokenizer=OurWords())


@pytest.mark.parametrize(("output", "reference"), REFERENCE_PAIRS)
def test_rouge_l_f1_equals_rouge_score(reference_rouge: tuple[Any, Any], output: str, reference: str) -> None:
    """Google's implementation (`RougeScorer(["rougeL"])`, no stemming) gives the same F1 to the last bit: on ASCII text
    with its own tokeniser (the same tokens, LCS and formula, rouge-score's score(target, prediction) order), on other
    text given our words."""
    theirs, given_ours = reference_rouge
    scorer = theirs if (output + reference).isascii() else given_ours
    assert rouge_l_f1(output, reference) == scorer.score(reference, output)["rougeL"].fmeasure


def test_letters_outside_ascii_are_words() -> None:
    """Where ours and rouge-score's tokeniser part, pinned: each Chinese or Japanese character is a word, other
    scripts' letter runs are words, accents stay inside their word."""
    assert words("北京是中国的首都") == ["北", "京", "是", "中", "国", "的", "首", "都"]
    assert words("answer: 北京 (Beijing)") == ["answer", "北", "京", "beijing"]
    assert words("東京へ行きます") == ["東", "京", "へ", "行", "き", "ま", "す"]
    assert words("Москва — столица") == ["москва", "столица"]
    assert words("café naïve, snake_case") == ["café", "naïve", "snake", "case"]
    assert rouge_l_f1("北京是中国的首都", "北京是中国的首都") == 1.0
    # LCS 2 (首都 or 北京, not both: they come in the other order): P 2/5, R 2/8
    assert rouge_l_f1("首都是北京", "北京是中国的首都") == pytest.approx(2 * (2 / 5) * (2 / 8) / (2 / 5 + 2 / 8))
    assert rouge_l_f1("café", "cafe") == 0.0


def test_lcs_is_a_subsequence_not_a_substring() -> None:
    assert lcs_length(list("abcbdab"), list("bdcaba")) == 4


def test_tool_calls_parse_name_and_arguments() -> None:
    assert tool_calls(call("add", {"a": 1, "b": 2})) == [("add", {"a": 1, "b": 2})]
    assert tool_calls(call("add", json.dumps({"a": 1}))) == [("add", {"a": 1})]  # arguments as a JSON string
    assert tool_calls(call("f", {}) + "\n" + call("g", {"x": [1]})) == [("f", {}), ("g", {"x": [1]})]
    assert tool_calls("no call here") == []
    assert tool_calls('<tool_call>\n{"name": "add", "arguments": {"a": 1') is None  # left open: cut off
    assert tool_calls("<tool_call>not json</tool_call>") is None
    assert tool_calls('<tool_call>{"arguments": {}}</tool_call>') is None  # no name
    assert tool_calls('<tool_call>{"name": "f", "arguments": [1]}</tool_call>') is None


def test_sums_of_hand_written_answers_give_pinned_figures() -> None:
    sums = Sums()
    reference = call("add", {"a": 1, "b": 2})
    cases = [
        ("Capital of France?", "Paris", "Paris"),
        ("What is it?", "The Eiffel Tower.", "eiffel tower"),
        ("Add 1 and 2", reference, call("add", {"b": 2, "a": 1})),  # JSON-equal: other key order
        ("Add 1 and 2", reference, '<tool_call>\n{"name": "add"'),  # cut off: does not parse
    ]
    scored = [sums.add(prompt, ref, out, output_length) for prompt, ref, out in cases]
    assert scored[1] == {
        "exact_match": 0.0,
        "normalized_exact_match": 1.0,
        "rouge_l_f1": pytest.approx(0.8),
        "scores.words": 2.0,
        "scores.saw_prompt": 1.0,
    }
    assert scored[2]["tool_call_correct"] == 1.0 and scored[3]["tool_call_parsed"] == 0.0
    result = figures(sums.values, sums.user)
    # The call's 11 words (tool call name add arguments a 1 b 2 tool call): LCS 9 with b first, 4 when cut off.
    rouge = (1 + 0.8 + 9 / 11 + 2 * (4 / 11) / (1 + 4 / 11)) / 4
    assert result == {
        "records": 4,
        "exact_match": 0.25,
        "normalized_exact_match": 0.5,
        "rouge_l_f1": pytest.approx(rouge, rel=1e-12),
        "tool_call_records": 2,
        "tool_call_parse_rate": 0.5,
        "tool_call_accuracy": 0.5,
        "scores": {"saw_prompt": 1.0, "words": (1 + 2 + 9 + 3) / 4},  # split on whitespace
    }


def test_figures_without_tool_calls_or_answers_are_none() -> None:
    sums = Sums()
    sums.add("q", "yes", "no", None)
    assert figures(sums.values, sums.user)["tool_call_accuracy"] is None
    assert figures(Sums().values, {})["exact_match"] is None


def test_a_user_scorer_is_loaded_by_its_path() -> None:
    scorer = load_scorer(f"{__name__}:output_length")
    assert scorer is output_length and load_scorer(None) is None


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("tests.no_such_module:f", "cannot import tests.no_such_module"),
        (f"{__name__}:no_such_function", "has no function no_such_function"),
        (f"{__name__}:json", "has no function json"),  # a module, not a function
    ],
)
def test_a_bad_scorer_path_is_one_line_naming_the_field(path: str, says: str) -> None:
    with pytest.raises(UserError) as error:
        load_scorer(path)
    assert str(error.value).startswith(f"eval.generate.scorer={path}: ") and says in str(error.value)
    assert "\n" not in str(error.value) and error.value.exit_code == 2


def test_a_scorer_that_returns_no_dict_of_numbers_is_refused() -> None:
    with pytest.raises(UserError, match=r"^eval.generate.scorer: .* must return a dict of score names to numbers"):
        Sums().add("q", "a", "b", lambda **_: {"ok": "yes"})
