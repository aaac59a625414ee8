"""Reward functions on a rank (trainer/objectives/rl/reward_funcs.py): TRL's signature (prompts, completions,
completion_ids and every column as a keyword argument, None where a record lacks it), a file's function run from its
staged copy held to its digest, and a function that raises, returns another count, a non-number or NaN stopping the run
in one line naming it and the record."""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from config.rewards import Reward
from config.sections.rl import RlConfig
from core.errors import UserError
from storage.location import Location
from storage.rewards import stage_rewards
from trainer.objectives.rl.reward_funcs import RewardFn, Scored, load_rewards, score

SCORED = Scored(
    prompts=[[{"role": "user", "content": "1+1?"}], [{"role": "user", "content": "2+2?"}]],
    texts=["2", "5"],
    ids=[[7, 1], [8, 1]],
    columns=[{"answer": "2", "level": 1}, {"answer": "4"}],
    locations=["data.jsonl:1", "data.jsonl:2"],
)


def reward(function: Any) -> RewardFn:
    return RewardFn("mine:fn", "fn", function)


def test_a_function_gets_trls_arguments_with_every_column() -> None:
    seen: dict[str, Any] = {}

    def fn(**kwargs: Any) -> list[float]:
        seen.update(kwargs)
        return [1.0, None]  # type: ignore[list-item]

    assert [row[0] if not math.isnan(row[0]) else None for row in score([reward(fn)], SCORED)] == [1.0, None]
    assert seen["completions"] == [[{"role": "assistant", "content": "2"}], [{"role": "assistant", "content": "5"}]]
    assert seen["prompts"] == SCORED.prompts and seen["completion_ids"] == SCORED.ids
    assert seen["answer"] == ["2", "4"] and seen["level"] == [1, None]


@pytest.mark.parametrize(
    ("function", "says"),
    [
        (
            lambda **_: 1 / 0,
            "reward mine:fn raised ZeroDivisionError (division by zero) scoring the completions of "
            "data.jsonl:1 and 1 more; fix the function",
        ),
        (lambda **_: [1.0], "reward mine:fn returned 1 rewards for 2 completions (of data.jsonl:1 and 1 more)"),
        (lambda **_: [1.0, float("nan")], "reward mine:fn returned nan for the record data.jsonl:2"),
        (lambda **_: [1.0, "high"], "reward mine:fn returned 'high' for the record data.jsonl:2; return a float"),
    ],
)
def test_a_broken_function_stops_in_one_line_naming_it_and_the_record(function: Any, says: str) -> None:
    with pytest.raises(UserError) as caught:
        score([reward(function)], SCORED)
    assert says in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.exit_code == 2


def test_a_files_function_runs_from_its_staged_copy_held_to_its_digest(tmp_path: Path) -> None:
    source = tmp_path / "mine.py"
    source.write_text(
        "def length(completions, **kwargs):\n    return [float(len(c[0]['content'])) for c in completions]\n"
    )
    storage = Location(str(tmp_path / "storage"))
    refs = stage_rewards([Reward.of(f"{source}:length")], storage)
    source.write_text("def length(**kwargs):\n    raise RuntimeError('the original file is never run')\n")
    rl = RlConfig(rewards=["format", f"{source}:length"])
    loaded = load_rewards(rl, refs, storage)
    assert [r.name for r in loaded] == ["format", "length"]
    assert score(loaded[1:], SCORED) == [[1.0], [1.0]]
    Path(refs[0].url or "").write_text("def length(**kwargs):\n    return []\n")
    sys.modules.pop(f"tandem_reward_{refs[0].digest[:16]}", None)  # type: ignore[index]
    with pytest.raises(UserError, match=r"do not match the digest spec\.json recorded"):
        load_rewards(rl, refs, storage)


def test_a_modules_function_is_imported_and_a_missing_one_named(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("tandem_test_rewards")
    module.ones = lambda completions, **_: [1.0] * len(completions)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tandem_test_rewards", module)
    (loaded,) = load_rewards(RlConfig(rewards=["tandem_test_rewards:ones"]), [], Location("/nowhere"))
    assert score([loaded], SCORED) == [[1.0], [1.0]]
    with pytest.raises(UserError, match="no function twos; fix the name after the colon"):
        load_rewards(RlConfig(rewards=["tandem_test_rewards:twos"]), [], Location("/nowhere"))
