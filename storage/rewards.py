"""Reward functions named by a file (train.rl.rewards' `path/to/file.py:function`) staged beside the data: the file's
bytes copied to {storage}/rewards/{sha256}/ (storage/layout.py `reward_file_url`) and referred to from spec.json with
their digest, so that every node runs the same bytes and the model's lineage names them (the registry entry, the model
card). A module's function (`module:function`) and a built-in reward are recorded by name alone: the code that runs
them is installed on every node.
"""

from __future__ import annotations

import os

from pydantic import Field

from config.rewards import Reward, RewardKind
from config.sections.base import Section
from core.errors import UserError
from storage import layout
from storage.digest import digest_bytes
from storage.fs import exists, read_bytes, write_bytes_atomic
from storage.location import Location


class RewardRef(Section):
    """A reward function of the run as spec.json records it: its config form, and for a file its staged copy's URL
    and the sha256 of its bytes."""

    name: str
    url: str | None = Field(None, description="{storage}/rewards/{sha256}/{file}; None: a built-in or a module's")
    digest: str | None = Field(None, description="sha256 of the file's bytes; None: a built-in or a module's")

    @property
    def reward(self) -> Reward:
        """The reward it records."""
        return Reward.of(self.name)

    def describe(self) -> str:
        """One line for the model card and the logs."""
        return self.name if self.digest is None else f"{self.name} (sha256 {self.digest[:16]})"


def stage_rewards(rewards: list[Reward], storage: Location) -> list[RewardRef]:
    """Every reward of the run as spec.json records it, each file's bytes staged under `storage` (once: a copy
    named by its digest is the same file)."""
    out = []
    for reward in rewards:
        if reward.kind is not RewardKind.FILE:
            out.append(RewardRef(name=reward.text))
            continue
        try:
            with open(reward.target, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            raise UserError(f"train.rl.rewards: cannot read {reward.target} ({exc.strerror}); fix the path") from None
        digest = digest_bytes(data, "sha256")
        url = layout.reward_file_url(storage, digest, os.path.basename(reward.target))
        if not exists(url):
            write_bytes_atomic(url, data)
        out.append(RewardRef(name=reward.text, url=str(url), digest=digest))
    return out


def read_reward_file(ref: RewardRef, run: Location) -> bytes:
    """A staged reward file's bytes (reached with the run's storage options), checked against its digest."""
    assert ref.url is not None and ref.digest is not None, f"{ref.name} is not a staged file"
    url = run.with_url(ref.url)
    try:
        data = read_bytes(url)
    except FileNotFoundError:
        raise UserError(f"{url}: the staged reward file of {ref.name} is missing; run the prepare step again") from None
    if digest_bytes(data, "sha256") != ref.digest:
        raise UserError(
            f"{url}: its bytes do not match the digest spec.json recorded for {ref.name} (sha256 {ref.digest[:16]}); "
            "run the prepare step again"
        )
    return data
