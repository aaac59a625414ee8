"""Regenerate data/grpo-demo/prompts.jsonl: the online RL demo's prompts (preset grpo-demo).

    python data/grpo-demo/make_prompts.py

TRL's conversational prompt form: `prompt` (a list of messages) and an `answer` column, which the accuracy reward
compares with and which every reward function receives. Small sums and differences; deterministic.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent / "prompts.jsonl"
RECORDS = 240


def records() -> list[dict]:
    """The demo's prompts, each with its answer."""
    rng = random.Random(2026)
    out = []
    for _ in range(RECORDS):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        if rng.random() < 0.5:
            question, answer = f"What is {a} plus {b}? Answer with a number.", a + b
        else:
            a, b = max(a, b), min(a, b)
            question, answer = f"What is {a} minus {b}? Answer with a number.", a - b
        out.append({"prompt": [{"role": "user", "content": question}], "answer": str(answer)})
    return out


if __name__ == "__main__":
    OUT.write_text("".join(json.dumps(record) + "\n" for record in records()))
    print(f"wrote {RECORDS} records to {OUT}")
