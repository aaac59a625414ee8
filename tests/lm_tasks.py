"""Two lm-evaluation-harness tasks of our own, with local data, as a user writes them for eval.tasks.include_path:
`tandem_choice` (multiple choice: log-likelihood of each answer) and `tandem_answer` (a generated answer, exact match).
Seven documents each, so that neither 2 nor 3 ranks share them evenly."""

from __future__ import annotations

import json
from pathlib import Path

QUESTIONS = [
    ("What is two plus two?", ["three", "four", "five"], 1),
    ("Which city is the capital of France?", ["Paris", "Rome", "Oslo"], 0),
    ("What colour is a clear sky?", ["green", "red", "blue"], 2),
    ("What is the opposite of hot?", ["cold", "warm", "loud"], 0),
    ("What is three times three?", ["six", "nine", "twelve"], 1),
    ("Which animal says woof?", ["cat", "cow", "dog"], 2),
    ("How many days are in a week?", ["seven", "five", "ten"], 0),
]
CHOICE_TASK = "tandem_choice"
ANSWER_TASK = "tandem_answer"


def task_yaml(name: str, data: Path, output_type: str) -> str:
    common = (
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\n'
    )
    if output_type == "multiple_choice":
        return common + (
            "output_type: multiple_choice\ndoc_to_choice: choices\ndoc_to_target: answer\nmetric_list:\n"
            "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
        )
    return common + (
        'output_type: generate_until\ndoc_to_target: "{{choices[answer]}}"\n'
        'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 6\n  do_sample: false\nmetric_list:\n'
        "  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
    )


def write_tasks(directory: Path, data_name: str = "questions.jsonl") -> Path:
    """The two tasks' YAML files and their data in `directory` (an eval.tasks.include_path); the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / data_name
    rows = [{"question": q, "choices": c, "answer": a} for q, c, a in QUESTIONS]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (directory / f"{CHOICE_TASK}.yaml").write_text(task_yaml(CHOICE_TASK, data, "multiple_choice"))
    (directory / f"{ANSWER_TASK}.yaml").write_text(task_yaml(ANSWER_TASK, data, "generate_until"))
    return directory
