"""The policy as objectives call it (trainer/objectives/policy.py): a micro-batch's forward pass on the device; with a
mixture of experts' router, the load-balancing loss of every pass with gradients kept for the step (and the routed
tokens counted), none from a pass without gradients (the reference's, an evaluation's), none for a dense model."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from storage.shards import Row
from trainer.data import collate
from trainer.objectives.policy import Policy
from trainer.parallel.distributed import Dist
from trainer.parallel.moe import RouterBalance

CPU = torch.device("cpu")
ONE = Dist(0, 0, 1, 0, "test", CPU)


@pytest.fixture(scope="module")
def moe() -> Any:
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    from tests.published import QWEN3_30B_A3B, QWEN3_MOE_SCALED

    torch.manual_seed(0)
    fields = {k: v for k, v in {**QWEN3_30B_A3B, **QWEN3_MOE_SCALED}.items() if k != "architectures"}
    return AutoModelForCausalLM.from_config(Qwen3MoeConfig(**{**fields, "vocab_size": 64}))


def batch() -> Any:
    return collate([Row(list(range(1, 8)), list(range(1, 8)), [7]), Row([3, 4, 5], [3, 4, 5], [3])], pad_id=0)


def test_a_pass_with_gradients_keeps_the_load_balancing_loss_for_the_step(moe: Any) -> None:
    router = RouterBalance.of(moe.config, None, ONE)
    assert router is not None
    policy = Policy(moe, CPU, router)
    out = policy.forward(batch(), {})
    aux = policy.take_aux()
    assert aux is not None and aux.requires_grad and torch.equal(aux, out.aux_loss)
    assert policy.take_aux() is None  # taken once
    assert router.counts is not None and int(router.counts.sum()) == 2 * 10 * 2  # layers x real tokens x top-k
    with torch.no_grad():
        policy.forward(batch(), {})  # the reference's or an evaluation's pass: not balanced
    assert policy.take_aux() is None


def test_a_dense_model_or_no_router_adds_nothing(moe: Any) -> None:
    policy = Policy(moe, CPU)
    policy.forward(batch(), {})
    assert policy.take_aux() is None and policy.router is None
