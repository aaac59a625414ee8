"""Regenerate data/sample/conversations.json: the demo's Qwen `conversations` dataset.

    python data/make_sample.py

Written for this project: small, checkable tasks (arithmetic, unit conversion, text edits, sorting,
multi-turn follow-ups) so that a tiny model's loss visibly falls in a few dozen steps. Deterministic.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent / "sample" / "conversations.json"
SYSTEMS = [None, "You are a careful assistant. Answer briefly.", "You are a helpful assistant."]
WORDS = [
    "river",
    "lantern",
    "copper",
    "meadow",
    "signal",
    "harbor",
    "pepper",
    "glacier",
    "orbit",
    "velvet",
    "timber",
    "canyon",
    "falcon",
    "ember",
    "quartz",
    "saddle",
    "thistle",
    "walnut",
]
UNITS = [
    ("kilometers", "meters", 1000),
    ("meters", "centimeters", 100),
    ("hours", "minutes", 60),
    ("minutes", "seconds", 60),
    ("kilograms", "grams", 1000),
    ("liters", "milliliters", 1000),
]


def arithmetic(rng: random.Random) -> list[tuple[str, str]]:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    op, result = rng.choice([("plus", a + b), ("minus", a - b), ("times", a * b)])
    return [("user", f"What is {a} {op} {b}?"), ("assistant", f"{a} {op} {b} is {result}.")]


def conversion(rng: random.Random) -> list[tuple[str, str]]:
    big, small, factor = rng.choice(UNITS)
    n = rng.randint(1, 40)
    return [
        ("user", f"How many {small} are in {n} {big}?"),
        ("assistant", f"There are {n * factor} {small} in {n} {big}, because one of the {big} is {factor} {small}."),
    ]


def reverse_word(rng: random.Random) -> list[tuple[str, str]]:
    word = rng.choice(WORDS)
    return [("user", f"Spell the word '{word}' backwards."), ("assistant", f"Backwards, '{word}' is '{word[::-1]}'.")]


def sort_words(rng: random.Random) -> list[tuple[str, str]]:
    words = rng.sample(WORDS, rng.randint(3, 5))
    return [
        ("user", "Sort these words alphabetically: " + ", ".join(words) + "."),
        ("assistant", "In alphabetical order: " + ", ".join(sorted(words)) + "."),
    ]


def count_letters(rng: random.Random) -> list[tuple[str, str]]:
    word = rng.choice(WORDS)
    letter = rng.choice(sorted(set(word)))
    n = word.count(letter)
    return [
        ("user", f"How many times does the letter '{letter}' appear in '{word}'?"),
        ("assistant", f"The letter '{letter}' appears {n} time{'s' if n != 1 else ''} in '{word}'."),
    ]


def multi_turn(rng: random.Random) -> list[tuple[str, str]]:
    a, b, c = rng.randint(2, 30), rng.randint(2, 30), rng.randint(2, 9)
    return [
        ("user", f"Add {a} and {b}."),
        ("assistant", f"{a} plus {b} is {a + b}."),
        ("user", f"Now multiply that by {c}."),
        ("assistant", f"{a + b} times {c} is {(a + b) * c}."),
    ]


TASKS = [arithmetic, conversion, reverse_word, sort_words, count_letters, multi_turn]


def main() -> None:
    rng = random.Random(7)
    records = []
    for i in range(240):
        turns = TASKS[i % len(TASKS)](rng)
        system = SYSTEMS[i % len(SYSTEMS)]
        convo = [{"from": "system", "value": system}] if system else []
        convo += [{"from": role, "value": text} for role, text in turns]
        records.append({"id": f"sample-{i:04d}", "conversations": convo})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(records, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(records)} records to {OUT}")


if __name__ == "__main__":
    main()
