"""The one map from the config's objectives (config/objectives.py) to their computation on a rank: `build` gives the
run's objective, keyed by the config's object itself (never by its name), with its settings from `train`.

The config's registry (`config.objectives.OBJECTIVES`) says what an objective is to every layer; this one says how it
computes, where torch is. Both list the same objectives (tests/unit/trainer/objectives/test_registry.py holds them
to it): adding an objective is one entry in each, and the step loop, the evaluation, the gate and the model card
follow without a change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from config.objectives import DPO, GRPO, IPO, KTO, ORPO, SFT, Objective
from config.sections.model_train import TrainConfig
from trainer.objectives.base import TrainObjective
from trainer.objectives.preference.kto import Kto
from trainer.objectives.preference.pairs import Dpo, Ipo, Orpo
from trainer.objectives.rl.objective import Grpo
from trainer.objectives.sft import Sft

# Each objective's batch, scope and sums types are its own: the registry holds them all, so its values are typed
# over any of them (the loop and the step are generic over them: trainer/step.py).
AnyObjective = TrainObjective[Any, Any, Any]
IMPLEMENTATIONS: dict[Objective, Callable[[TrainConfig], AnyObjective]] = {
    SFT: Sft.of,
    DPO: Dpo.of,
    IPO: Ipo.of,
    KTO: Kto.of,
    ORPO: Orpo.of,
    GRPO: Grpo.of,
}


def build(train: TrainConfig) -> AnyObjective:
    """The run's objective (train.objective) with its settings."""
    return IMPLEMENTATIONS[train.objective](train)
