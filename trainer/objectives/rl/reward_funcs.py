"""Online RL's reward functions on a rank: loaded once (built-ins, your module's function, or your file's, read from
its staged copy and held to the digest spec.json recorded: storage/rewards.py), and called with TRL's signature on a
batch of completions, their answers checked.

A call is `function(prompts=, completions=, completion_ids=, **columns)`: `prompts` each completion's prompt messages,
`completions` TRL's conversational form (`[{"role": "assistant", "content": text}]`), `completion_ids` the tokens,
and every column of the records (GSM8K's `answer`, OpenR1-Math's `solution` and `answer`, anything else a record
carries) as a list with one value per completion (None where a record lacks it). It returns one float, or None (not
applicable: left out of the means, TRL's convention), per completion. A function that raises, returns another count,
a value that is not a number, or NaN stops the run: a `UserError` (exit 2) naming the function and the record.
"""

from __future__ import annotations

import importlib
import math
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from config.rewards import Reward, RewardKind
from config.sections.rl import RlConfig
from core.errors import UserError
from storage.location import Location
from storage.rewards import RewardRef, read_reward_file
from trainer.objectives.rl.rewards import RewardFunction, builtin


@dataclass(frozen=True)
class RewardFn:
    """A loaded reward function: its config form, the name its metrics carry, the function."""

    text: str
    name: str
    function: RewardFunction


@dataclass(frozen=True)
class Scored:
    """What a batch of completions is scored from: per completion its prompt's messages, its text and tokens, its
    record's columns and location."""

    prompts: list[list[dict[str, Any]]]
    texts: list[str]
    ids: list[list[int]]
    columns: list[dict[str, Any]]
    locations: list[str]


def load_rewards(rl: RlConfig, refs: Sequence[RewardRef], run: Location) -> list[RewardFn]:
    """train.rl.rewards' functions, in order (a file's from its staged copy, named in `refs`: spec.json's)."""
    staged = {ref.name: ref for ref in refs}
    return [RewardFn(reward.text, reward.name, _load(reward, rl, staged, run)) for reward in rl.parsed_rewards]


def _load(reward: Reward, rl: RlConfig, staged: dict[str, RewardRef], run: Location) -> RewardFunction:
    if reward.kind is RewardKind.BUILTIN:
        return builtin(reward.target, rl.reasoning_tag, rl.answer_tag)
    if reward.kind is RewardKind.MODULE:
        try:
            module = importlib.import_module(reward.target)
        except ImportError as exc:
            raise UserError(
                f"train.rl.rewards: {reward.text}: cannot import {reward.target} ({exc}); install it on every node"
            ) from None
    else:
        ref = staged.get(reward.text)
        if ref is None or ref.digest is None:
            raise UserError(f"train.rl.rewards: {reward.text} was not staged (spec.json has no copy); prepare the run")
        module = _file_module(reward, read_reward_file(ref, run), ref.digest)
    function = getattr(module, reward.function, None)
    if not callable(function):
        raise UserError(f"train.rl.rewards: {reward.text}: no function {reward.function}; fix the name after the colon")
    return function


def _file_module(reward: Reward, source: bytes, digest: str) -> types.ModuleType:
    """A staged file run as a module of its own (named by its digest, so two files never share one)."""
    name = f"tandem_reward_{digest[:16]}"
    if name in sys.modules:
        return sys.modules[name]
    module = types.ModuleType(name)
    module.__file__ = reward.target
    sys.modules[name] = module
    try:
        exec(compile(source, reward.target, "exec"), module.__dict__)
    except Exception as exc:  # noqa: BLE001 - the user's file, whatever it raises: one line
        del sys.modules[name]
        raise UserError(
            f"train.rl.rewards: {reward.text}: the file failed to load ({type(exc).__name__}: {exc})"
        ) from None
    return module


def score(rewards: Sequence[RewardFn], batch: Scored) -> list[list[float]]:
    """Every completion's reward from each function (NaN for None), rows in the batch's order."""
    keys = sorted({key for columns in batch.columns for key in columns})
    kwargs = {key: [columns.get(key) for columns in batch.columns] for key in keys}
    completions = [[{"role": "assistant", "content": text}] for text in batch.texts]
    out = [[math.nan] * len(rewards) for _ in batch.texts]
    for k, reward in enumerate(rewards):
        for i, value in enumerate(call(reward, batch, completions, kwargs)):
            out[i][k] = value
    return out


def call(reward: RewardFn, batch: Scored, completions: list[Any], kwargs: dict[str, list[Any]]) -> list[float]:
    """One function's rewards of a batch, checked; NaN for None."""
    where = batch.locations[0] + (f" and {len(batch.locations) - 1} more" if len(batch.locations) > 1 else "")
    try:
        values = reward.function(prompts=batch.prompts, completions=completions, completion_ids=batch.ids, **kwargs)
        values = list(values)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's code is one line, not a traceback
        # "KeyError (...)", not "KeyError: ...": the log masking reads `<...key...>: value` as a credential.
        raise UserError(
            f"reward {reward.text} raised {type(exc).__name__} ({str(exc)[:200]}) scoring the completions of {where}; "
            "fix the function"
        ) from None
    if len(values) != len(batch.texts):
        raise UserError(
            f"reward {reward.text} returned {len(values)} rewards for {len(batch.texts)} completions (of {where}); "
            "return one per completion"
        )
    return [_checked(reward, value, batch.locations[i]) for i, value in enumerate(values)]


def _checked(reward: RewardFn, value: object, location: str) -> float:
    if value is None:
        return math.nan
    if not isinstance(value, int | float):
        try:
            value = float(value)  # type: ignore[arg-type]  # a numpy or torch scalar
        except (TypeError, ValueError):
            raise UserError(
                f"reward {reward.text} returned {value!r:.60} for the record {location}; return a float or None"
            ) from None
    if math.isnan(value) or math.isinf(value):
        raise UserError(
            f"reward {reward.text} returned {value} for the record {location}; return a finite float, or None when "
            "the reward does not apply"
        )
    return float(value)
