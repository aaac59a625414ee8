"""Regenerate data/sample/preferences.jsonl: the preference demo's DPO pairs (TRL's conversational form).

    python data/make_preferences.py

Written for this project: small, checkable questions (arithmetic, unit conversion, spelling, sorting), each with a
chosen answer that is right and complete and a rejected one that is wrong, evasive or off-topic, so that a tiny model
learns the preference within one short run. Deterministic.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent / "sample" / "preferences.jsonl"
WORDS = ["river", "lantern", "copper", "meadow", "signal", "harbor", "pepper", "glacier", "orbit", "velvet"]
UNITS = [("kilometers", "meters", 1000), ("hours", "minutes", 60), ("kilograms", "grams", 1000)]
EVASIVE = ["I am not sure, please ask someone else.", "That is not something I can answer.", "Maybe, maybe not."]


def arithmetic(rng: random.Random) -> tuple[str, str, str]:
    a, b = rng.randint(2, 60), rng.randint(2, 60)
    wrong = a + b + rng.choice([-3, -1, 1, 2, 5])
    return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}.", rng.choice([f"It is {wrong}.", *EVASIVE])


def conversion(rng: random.Random) -> tuple[str, str, str]:
    big, small, factor = rng.choice(UNITS)
    n = rng.randint(2, 12)
    question = f"How many {small} are in {n} {big}?"
    return question, f"{n} {big} is {n * factor} {small}.", rng.choice([f"About {n + factor} {small}.", *EVASIVE])


def spelling(rng: random.Random) -> tuple[str, str, str]:
    word = rng.choice(WORDS)
    question = f"Spell the word {word} backwards."
    return question, f"{word} backwards is {word[::-1]}.", rng.choice([f"{word} backwards is {word}.", *EVASIVE])


def sorting(rng: random.Random) -> tuple[str, str, str]:
    numbers = rng.sample(range(1, 50), 4)
    while numbers == sorted(numbers):  # the rejected answer repeats the list: it must be out of order
        rng.shuffle(numbers)
    listed = ", ".join(map(str, numbers))
    answer = ", ".join(map(str, sorted(numbers)))
    return f"Sort these numbers: {listed}.", f"In order: {answer}.", rng.choice([f"In order: {listed}.", *EVASIVE])


def main(count: int = 160, seed: int = 7) -> None:
    """Write `count` pairs."""
    rng = random.Random(seed)
    tasks = [arithmetic, conversion, spelling, sorting]
    lines = []
    for index in range(count):
        question, chosen, rejected = tasks[index % len(tasks)](rng)
        record = {
            "prompt": [{"role": "user", "content": question}],
            "chosen": [{"role": "assistant", "content": chosen}],
            "rejected": [{"role": "assistant", "content": rejected}],
        }
        lines.append(json.dumps(record))
    OUT.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
