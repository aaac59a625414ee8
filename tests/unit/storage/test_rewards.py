"""Reward files staged beside the data (storage/rewards.py): named by the digest of their bytes under run.storage, once;
read back held to that digest; built-ins and modules recorded by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.rewards import Reward
from core.errors import UserError
from storage.location import Location
from storage.rewards import read_reward_file, stage_rewards


def test_a_file_is_staged_by_its_digest_and_read_back_held_to_it(tmp_path: Path) -> None:
    source = tmp_path / "reward.py"
    source.write_text("def r(**kwargs):\n    return []\n")
    storage = Location(str(tmp_path / "storage"))
    builtin, module, file = stage_rewards(
        [Reward.of("accuracy"), Reward.of("pkg.mod:fn"), Reward.of(f"{source}:r")], storage
    )
    assert (builtin.url, builtin.digest, module.describe()) == (None, None, "pkg.mod:fn")
    assert file.digest is not None and file.url == str(
        tmp_path / "storage" / "rewards" / file.digest[:16] / "reward.py"
    )
    assert file.describe() == f"{source}:r (sha256 {file.digest[:16]})"
    assert read_reward_file(file, storage) == source.read_bytes()
    assert stage_rewards([Reward.of(f"{source}:r")], storage) == [file]  # the same bytes: the same copy
    Path(file.url).write_text("changed")
    with pytest.raises(UserError, match=r"do not match the digest spec\.json recorded"):
        read_reward_file(file, storage)
