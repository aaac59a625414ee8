"""The one map from the config's objectives to their computation (trainer/objectives/registry.py): every objective of
config/objectives.py has exactly one implementation, built with its settings, and no production module compares an
objective's name outside the config's registry (an objective is dispatched through its object, never a string)."""

from __future__ import annotations

import ast
from pathlib import Path

from config.objectives import OBJECTIVES
from config.sections.model_train import TrainConfig
from tests.unit.test_layout import ROOT, sources
from trainer.objectives.preference.kto import Kto
from trainer.objectives.preference.pairs import Dpo, Ipo, Orpo
from trainer.objectives.registry import IMPLEMENTATIONS, build
from trainer.objectives.rl.objective import Grpo
from trainer.objectives.sft import Sft

REGISTRY = ROOT / "config" / "objectives.py"


def test_every_objective_has_one_implementation_built_with_its_settings() -> None:
    assert list(IMPLEMENTATIONS) == list(OBJECTIVES.values())
    expected = {"sft": Sft, "dpo": Dpo, "ipo": Ipo, "kto": Kto, "orpo": Orpo, "grpo": Grpo}
    for name, objective in OBJECTIVES.items():
        settings = {"preference": {"beta": 0.25}, "rl": {"beta": 0.25}, "loss_chunk_tokens": 64}
        built = build(TrainConfig.model_validate({"objective": name, **settings}))
        assert type(built) is expected[name] and built.objective is objective
        if isinstance(built, Grpo):
            assert built.rl.beta == 0.25
        else:
            assert built.chunk_tokens == 64 if isinstance(built, Sft) else built.beta == 0.25


def names_compared(path: Path) -> list[int]:
    """The line of each comparison of an objective's name in a module: a string constant that names an objective,
    compared (==, !=, in) with an expression that mentions an objective."""
    names = set(OBJECTIVES)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        parts = [node.left, *node.comparators]
        constants = {
            c.value
            for part in parts
            for c in ast.walk(part)
            if isinstance(c, ast.Constant) and isinstance(c.value, str)
        }
        if constants & names and "objective" in ast.unparse(node):
            found.append(node.lineno)
    return found


def test_no_module_compares_an_objectives_name() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}" for _, path in sources() if path != REGISTRY for line in names_compared(path)
    ]
    assert not offenders, f"objectives dispatched by name (use the objective's own fields): {offenders}"


def test_the_check_finds_a_comparison(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text('def f(train):\n    return train.objective.name in ("dpo", "ipo")\n\n\nX = "sft" == "sft"\n')
    assert names_compared(module) == [2]
