"""eval.tasks' index on a node (config/lm_tasks.py): a name lm-evaluation-harness does not know, and an include_path
this node lacks, are refused in one line; the digest of your task files changes with them (the base model's cached
task figures are keyed by it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.lm_tasks import include_digest, task_manager
from config.sections.results import TasksConfig
from core.errors import UserError
from tests.lm_tasks import CHOICE_TASK, write_tasks


def test_an_unknown_task_is_refused_in_one_line_naming_it(tmp_path) -> None:
    cfg = TasksConfig(names=[CHOICE_TASK, "no_such_task"], include_path=str(write_tasks(tmp_path / "tasks")))
    with pytest.raises(UserError) as refused:
        task_manager(cfg)
    message = str(refused.value)
    assert "eval.tasks.names: no lm-evaluation-harness task or group no_such_task" in message
    assert "`lm-eval ls tasks` lists them" in message and "\n" not in message


def test_a_missing_include_path_is_refused_and_the_files_key_the_base_cache(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"eval.tasks.include_path=.*/nowhere: no such directory on .*every node"):
        task_manager(TasksConfig(names=[CHOICE_TASK], include_path=str(tmp_path / "nowhere")))
    cfg = TasksConfig(names=[CHOICE_TASK], include_path=str(write_tasks(tmp_path / "tasks")))
    before = include_digest(cfg)
    assert before == include_digest(cfg) and include_digest(TasksConfig(names=[CHOICE_TASK])) is None
    (tmp_path / "tasks" / "questions.jsonl").write_text('{"question": "changed", "choices": ["a"], "answer": 0}\n')
    assert include_digest(cfg) != before  # changed data: the base model's cached task figures are not reused
