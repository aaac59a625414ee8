"""Benchmark tasks (eval.tasks, trainer/evaluation/lm_tasks.py) in one process on the session's tiny model:
lm-evaluation-harness
runs our own local tasks on the model in memory, and a multiple-choice task's accuracy equals the argmax of each
answer's log-likelihood computed here with the model directly; eval.json's names for the harness's metrics; and the
one-line refusal of a task whose data cannot be loaded (names and include_path: tests/unit/config/test_lm_tasks.py).
Shared across 1, 2 and 3 torchrun ranks, and beside the base model: tests/distributed/test_evaluate.py."""

from __future__ import annotations

import pytest
import torch

from config.lm_tasks import task_manager
from config.sections.results import TasksConfig
from core.errors import UserError
from tests.lm_tasks import ANSWER_TASK, CHOICE_TASK, QUESTIONS, write_tasks
from trainer.evaluation.lm_tasks import figures, run_tasks
from trainer.parallel.distributed import Dist

ONE = Dist(rank=0, local_rank=0, world_size=1, node_rank=0, host="h", device=torch.device("cpu"))


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model).eval(), AutoTokenizer.from_pretrained(tiny_model)


def log_likelihood(model, tokenizer, context: str, continuation: str) -> float:
    """log p(continuation | context), the continuation's tokens being those the whole text has past the context's."""
    whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
    prefix = len(tokenizer(context, add_special_tokens=False)["input_ids"])
    with torch.no_grad():
        logits = model(torch.tensor([whole])).logits[0].log_softmax(-1)
    return sum(logits[i - 1, whole[i]].item() for i in range(prefix, len(whole)))


def test_a_choice_tasks_accuracy_is_the_argmax_of_each_answers_log_likelihood(model_and_tokenizer, tmp_path) -> None:
    model, tokenizer = model_and_tokenizer
    cfg = TasksConfig(names=[CHOICE_TASK, ANSWER_TASK], include_path=str(write_tasks(tmp_path / "tasks")))
    found = run_tasks(model, tokenizer, cfg, task_manager(cfg), ONE, seed=0)
    right = 0
    for question, choices, answer in QUESTIONS:
        context = f"Question: {question}\nAnswer:"
        scores = [log_likelihood(model, tokenizer, context, f" {choice}") for choice in choices]
        right += max(range(len(choices)), key=scores.__getitem__) == answer
    assert found["tasks"][CHOICE_TASK] == {"acc": right / len(QUESTIONS)}
    assert 0 <= found["tasks"][ANSWER_TASK]["exact_match"] <= 1
    detail = found["tasks_detail"]
    assert detail["harness_version"] == "0.4.13" and detail["seconds"] > 0 and detail["limit"] is None
    assert detail["per_task"][CHOICE_TASK]["samples"] == len(QUESTIONS) == detail["per_task"][ANSWER_TASK]["samples"]
    assert detail["per_task"][CHOICE_TASK]["higher_is_better"] == {"acc": True}
    assert set(detail["per_task"][CHOICE_TASK]["stderr"]) == {"acc"}
    limited = cfg.model_copy(update={"names": [CHOICE_TASK], "limit": 3})
    assert (
        run_tasks(model, tokenizer, limited, task_manager(limited), ONE, seed=0)["tasks_detail"]["per_task"][
            CHOICE_TASK
        ]["samples"]
        == 3
    )


def test_the_harness_metric_names_become_eval_json_keys() -> None:
    """ "acc,none" is `acc`; a filter's name follows its metric's; standard errors go to tasks_detail; a group's "N/A"
    and the harness's names and aliases are not metrics."""
    result = {
        "results": {
            "gsm": {"alias": "gsm", "exact_match,strict-match": 0.25, "exact_match_stderr,strict-match": 0.1},
            "grp": {"alias": "grp", "acc,none": 0.5, "acc_stderr,none": "N/A", "sample_len": 4},
        },
        "n-samples": {"gsm": {"original": 8, "effective": 4}},
        "n-shot": {"gsm": 5},
        "higher_is_better": {"gsm": {"exact_match": True}},
    }
    out = figures(result, 1.5, TasksConfig(names=["gsm", "grp"], limit=4))
    assert out["tasks"] == {"gsm": {"exact_match-strict-match": 0.25}, "grp": {"acc": 0.5}}
    gsm = out["tasks_detail"]["per_task"]["gsm"]
    assert gsm == {
        "samples": 4,
        "num_fewshot": 5,
        "stderr": {"exact_match-strict-match": 0.1},
        "higher_is_better": {"exact_match": True},
    }
    assert out["tasks_detail"]["per_task"]["grp"]["stderr"] == {} and out["tasks_detail"]["limit"] == 4


def test_a_task_whose_data_is_missing_is_refused_in_one_line_naming_it(model_and_tokenizer, tmp_path) -> None:
    model, tokenizer = model_and_tokenizer
    tasks = write_tasks(tmp_path / "tasks")
    (tasks / "questions.jsonl").unlink()
    cfg = TasksConfig(names=[CHOICE_TASK], include_path=str(tasks))
    with pytest.raises(UserError) as refused:
        run_tasks(model, tokenizer, cfg, task_manager(cfg), ONE, seed=0)
    message = str(refused.value)
    assert message.startswith(f"eval.tasks: task {CHOICE_TASK} cannot load its data") and "\n" not in message
    assert "eval.tasks.include_path" in message
