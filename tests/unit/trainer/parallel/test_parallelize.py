"""The parallel layout applied to a built model (trainer/parallel/parallelize.py): a dense model has no router
balance; a mixture of experts gets one, with the model config's coefficient or train.moe.aux_loss_coef; the chaos
suite's disjoint routing forces every token of rank r to its own experts; a model whose attention Ulysses does not
wrap is refused with sequence parallelism, in one line."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from config.sections.model_train import MoeConfig, TrainConfig
from core.errors import UserError
from trainer.parallel.distributed import Dist
from trainer.parallel.parallelize import parallelize
from trainer.watch.faults import NO_FAULTS, Faults

ONE = Dist(0, 0, 1, 0, "test", torch.device("cpu"))


def moe() -> Any:
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    from tests.published import QWEN3_30B_A3B, QWEN3_MOE_SCALED

    torch.manual_seed(0)
    fields = {k: v for k, v in {**QWEN3_30B_A3B, **QWEN3_MOE_SCALED}.items() if k != "architectures"}
    return AutoModelForCausalLM.from_config(Qwen3MoeConfig(**{**fields, "vocab_size": 64}))


def dense() -> Any:
    from trainer.model import tiny

    return tiny.build_model(64, pad_id=0, eos_id=1)


def test_a_dense_model_has_no_router_and_a_mixture_of_experts_has_its_own_coefficient() -> None:
    assert parallelize(dense(), TrainConfig(), ONE, 2, NO_FAULTS) is None
    router = parallelize(moe(), TrainConfig(), ONE, 2, NO_FAULTS)
    assert router is not None and router.coef == 0.001  # Qwen3-30B-A3B's router_aux_loss_coef
    configured = parallelize(moe(), TrainConfig(moe=MoeConfig(aux_loss_coef=0.25)), ONE, 2, NO_FAULTS)
    assert configured is not None and configured.coef == 0.25


def test_disjoint_routing_sends_every_token_of_a_rank_to_its_own_experts() -> None:
    model = moe()
    rank1 = dataclasses.replace(ONE, rank=1, world_size=2)
    parallelize(model, TrainConfig(), rank1, 2, Faults(disjoint_routing=True))
    seen: list[torch.Tensor] = []
    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    routers[0].register_forward_hook(lambda module, args, output: seen.append(output[2]))
    model(input_ids=torch.tensor([[1, 2, 3, 4]]))
    k = int(model.config.num_experts_per_tok)
    assert seen and set(seen[0].flatten().tolist()) == set(range(k, 2 * k))  # rank 1's experts k .. 2k-1


def test_sequence_parallelism_refuses_an_attention_ulysses_does_not_wrap() -> None:
    model = dense()
    model.config._attn_implementation = "eager"
    with pytest.raises(UserError, match=r"train\.sequence_parallel_size=2: the model loaded with attention 'eager'"):
        parallelize(model, TrainConfig(), dataclasses.replace(ONE, sequence_parallel=2), 2, NO_FAULTS)
