"""Online RL's reward functions as the config names them (`train.rl.rewards`), torch-free: a built-in reward
(`accuracy`, `format`, `tool_call`), your function in an importable module (`module:function`), or your function in a
Python file (`path/to/file.py:function`), which the prepare step stages beside the data so that every node runs the
same bytes (storage/rewards.py).

`Reward.of` reads a name once, where the config is validated; `check_reward` is the config-time check of what the
name points at (the file exists and defines the function; the module can be found and, when it is a source file,
defines it), run where a command line or the flow takes the config (config/loader.py `check_paths`), never on a node
that re-reads spec.json (where a file's path is the machine that launched it's). The ranks load and call them
(trainer/objectives/rl/reward_funcs.py).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

BUILTIN_REWARDS = ("accuracy", "format", "tool_call")
MODULE_REWARD = re.compile(r"^(?P<target>[A-Za-z_][\w.]*):(?P<function>[A-Za-z_]\w*)$")
FILE_REWARD = re.compile(r"^(?P<target>.+\.py):(?P<function>[A-Za-z_]\w*)$")


class RewardKind(Enum):
    """Where a reward function comes from."""

    BUILTIN = "builtin"
    MODULE = "module"
    FILE = "file"


@dataclass(frozen=True)
class Reward:
    """One entry of train.rl.rewards: its kind, the module or file (`target`; the built-in's name), the function,
    and the name its metrics carry (TRL's: the function's name)."""

    kind: RewardKind
    target: str
    function: str

    @classmethod
    def of(cls, text: str) -> Reward:
        """A reward from its config form; ValueError (the fix in its text) for one that is none of the three."""
        if text in BUILTIN_REWARDS:
            return cls(RewardKind.BUILTIN, text, text)
        if match := FILE_REWARD.match(text):
            return cls(RewardKind.FILE, match["target"], match["function"])
        if match := MODULE_REWARD.match(text):
            return cls(RewardKind.MODULE, match["target"], match["function"])
        raise ValueError(
            f"train.rl.rewards: {text!r} is not a reward; give a built-in one ({', '.join(BUILTIN_REWARDS)}), "
            "module:function (importable on every node) or path/to/file.py:function"
        )

    @property
    def name(self) -> str:
        """The name of its metrics (rewards/<name>/mean) and of its figures in eval.json."""
        return self.function

    @property
    def text(self) -> str:
        """Its config form."""
        return self.target if self.kind is RewardKind.BUILTIN else f"{self.target}:{self.function}"


def check_reward(reward: Reward) -> None:
    """The config-time check of a module's or file's reward: ValueError naming it and the fix (built-ins pass)."""
    if reward.kind is RewardKind.FILE:
        if not os.path.isfile(reward.target):
            raise ValueError(
                f"train.rl.rewards: {reward.target} does not exist; give an existing Python file (relative paths are "
                "tried against the working directory, then the project root)"
            )
        _check_defines(reward, reward.target)
    elif reward.kind is RewardKind.MODULE:
        try:
            spec = importlib.util.find_spec(reward.target)
        except (ImportError, ValueError) as exc:
            spec, why = None, f" ({exc})"
        else:
            why = ""
        if spec is None:
            raise ValueError(
                f"train.rl.rewards: cannot find module {reward.target}{why}; install it on every node, fix the module "
                "path, or name a file (path/to/file.py:function)"
            )
        if spec.origin and spec.origin.endswith(".py") and os.path.isfile(spec.origin):
            _check_defines(reward, spec.origin)


def _check_defines(reward: Reward, path: str) -> None:
    """The source file at `path` defines `reward.function` at its top level (parsed, never run)."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)
    except (SyntaxError, UnicodeDecodeError) as exc:
        raise ValueError(f"train.rl.rewards: {path} is not valid Python ({exc}); fix the file") from None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
    if reward.function not in names:
        raise ValueError(
            f"train.rl.rewards: {path} defines no function {reward.function}; fix the function name after the colon"
        )
