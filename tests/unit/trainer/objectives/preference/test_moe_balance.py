"""A preference objective on a mixture of experts (trainer/objectives/preference/objective.py with trainer/moe.py): the
router's load-balancing loss is added to the policy's as SFT adds it (train.moe.aux_loss_coef, else the model config's
router_aux_loss_coef) and logged apart, on the Qwen3-30B-A3B shape scaled down (tests/published.py) with a vocabulary
of 256. ORPO needs no reference model, so the policy is the plain model; DPO, IPO and KTO share the code path
(`unit_losses` and `micro_batch` of the base class)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from config.objectives import objective_named
from config.sections.model_train import MoeConfig, TrainConfig
from storage.shards import IGNORE_INDEX, PAIR, Row
from tests.unit.trainer.objectives.pinned import ONE
from trainer.objectives.preference.batching import collate_preference
from trainer.objectives.preference.pairs import Orpo


@pytest.fixture(scope="module")
def model() -> Any:
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    from tests.published import QWEN3_30B_A3B, QWEN3_MOE_SCALED

    torch.manual_seed(0)
    fields = {k: v for k, v in {**QWEN3_30B_A3B, **QWEN3_MOE_SCALED}.items() if k != "architectures"}
    return AutoModelForCausalLM.from_config(Qwen3MoeConfig(**{**fields, "vocab_size": 256})).float()


def pairs() -> list[Row]:
    generator, out = torch.Generator().manual_seed(4), []
    for k in range(2):
        p, c, r = 3 + k, 2 + 2 * k, 4 - k
        ids = torch.randint(2, 256, (p + c + r,), generator=generator).tolist()
        out.append(Row(ids, [IGNORE_INDEX] * p + ids[p:], [p, c, r]))
    return out


def orpo_step(model: Any, coef: float | None, *, router: bool = True) -> tuple[Any, Any, dict[str, Any]]:
    """(the objective, its micro-batch's loss for backward, the step's metrics) of one ORPO micro-batch of 2 pairs."""
    train = TrainConfig(objective=objective_named("orpo"), moe=MoeConfig(aux_loss_coef=coef))
    objective = Orpo.of(train)
    if router:
        objective.start(model, None, ONE, 0)  # type: ignore[arg-type]  # ORPO reads no spec: no reference table
    batch = collate_preference(pairs(), [PAIR, PAIR], 0, indices=[0, 1])
    scope = objective.begin_step(model, [batch], ONE)
    micro = objective.micro_batch(model, batch, scope)
    sums = {key: float(micro.sums[key]) for key in objective.sum_keys}
    result = objective.end_step(sums, scope)
    return objective, micro, {**result.metrics, "loss": result.loss}


def test_the_weighted_balancing_loss_is_added_to_the_preference_loss_and_logged_apart(model: Any) -> None:
    plain, plain_micro, plain_metrics = orpo_step(model, None, router=False)
    assert plain.router is None and "aux_loss" not in plain_metrics
    objective, micro, metrics = orpo_step(model, 0.25)
    assert objective.router is not None and objective.router.coef == 0.25
    aux = metrics["aux_loss"]
    assert aux > 0.0  # Switch's loss is experts x sum(share x probability): about 1 for a router near even
    # The total is the preference loss plus the coefficient times the auxiliary loss; the logged loss is ORPO's alone.
    assert float(micro.backward.detach()) == pytest.approx(float(plain_micro.backward) + 0.25 * aux, rel=1e-6)
    assert metrics["loss"] == pytest.approx(plain_metrics["loss"], rel=1e-6)
    assert metrics["expert_load_max"] >= 1.0 and metrics["experts_idle"] >= 0.0
    micro.backward.backward()  # the router gets the balancing loss's gradient
    gate = model.model.layers[0].mlp.gate.weight.grad
    assert gate is not None and gate.abs().sum() > 0
    model.zero_grad()


def test_the_model_configs_coefficient_is_the_default_and_zero_adds_nothing(model: Any) -> None:
    objective, _, _ = orpo_step(model, None)
    assert objective.router is not None and objective.router.coef == 0.001  # Qwen3-30B-A3B's router_aux_loss_coef
    _, plain_micro, _ = orpo_step(model, None, router=False)
    _, micro, metrics = orpo_step(model, 0.0)
    assert metrics["aux_loss"] > 0.0  # measured and logged, not trained on
    assert float(micro.backward) == pytest.approx(float(plain_micro.backward), rel=1e-6)
