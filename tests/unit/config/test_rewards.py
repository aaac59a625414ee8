"""Reward functions as the config names them (config/rewards.py): the three forms read once, and the config-time check
that a file exists and defines the function, and that a module can be found, each refused in one line with the fix
(through the loader, as a command line meets them: the file's path made absolute)."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.loader import load_config
from config.rewards import Reward, RewardKind, check_reward
from core.errors import UserError

GRPO = ["train.objective=grpo", "train.micro_batch_size=4", "train.global_batch_size=16"]


def test_the_three_forms() -> None:
    assert Reward.of("accuracy") == Reward(RewardKind.BUILTIN, "accuracy", "accuracy")
    assert Reward.of("my_pkg.rewards:score") == Reward(RewardKind.MODULE, "my_pkg.rewards", "score")
    file = Reward.of("data/x/reward.py:digits")
    assert (file.kind, file.target, file.name, file.text) == (RewardKind.FILE, "data/x/reward.py", "digits",
                                                              "data/x/reward.py:digits")  # fmt: skip
    with pytest.raises(ValueError, match="'accurate' is not a reward; give a built-in one"):
        Reward.of("accurate")


def test_a_files_function_is_made_absolute_and_checked_at_config_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text("import math\n\ndef score(completions, **kwargs):\n    return [1.0]\n")
    cfg = load_config(None, [*GRPO, "train.rl.rewards=[format, mine.py:score]"])
    assert cfg.train.rl.rewards == ["format", f"{tmp_path / 'mine.py'}:score"]
    with pytest.raises(UserError, match="defines no function scored; fix the function name after the colon"):
        load_config(None, [*GRPO, "train.rl.rewards=[mine.py:scored]"])
    with pytest.raises(UserError, match=r"missing.py does not exist; give an existing Python file"):
        load_config(None, [*GRPO, "train.rl.rewards=[missing.py:score]"])


def test_a_module_is_found_without_being_run_and_its_function_checked() -> None:
    check_reward(Reward.of("config.rewards:check_reward"))
    with pytest.raises(ValueError, match="cannot find module no_such_rewards; install it on every node"):
        check_reward(Reward.of("no_such_rewards:score"))
    with pytest.raises(ValueError, match="defines no function nothing"):
        check_reward(Reward.of("config.rewards:nothing"))


def test_two_rewards_of_one_name_and_weights_of_another_count_are_refused() -> None:
    with pytest.raises(UserError, match="two rewards are named accuracy"):
        load_config(None, [*GRPO, "train.rl.rewards=[accuracy, config.rewards:accuracy]"])
    with pytest.raises(UserError, match=r"train\.rl\.reward_weights has 1 weights for 2 rewards"):
        load_config(None, [*GRPO, "train.rl.rewards=[accuracy, format]", "train.rl.reward_weights=[1.0]"])
