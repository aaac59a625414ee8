"""SFT (trainer/objectives/sft.py) on the fixed batch of pinned.py: its summed training loss by every loss path (full
logits, the last hidden states in one pass and in chunks) and its evaluation's sums and metrics, pinned (pinned.py says
where the literals come from and why they may not move)."""

from __future__ import annotations

from typing import Any

import pytest

from storage.shards import Row
from tests.unit.trainer.objectives.pinned import CHUNK, assert_pinned, measure_sft_eval, measure_sft_losses


def test_sft_training_loss_is_pinned_by_every_loss_path(pinned_model: Any, pinned_rows: list[Row]) -> None:
    assert_pinned(
        measure_sft_losses(pinned_model, pinned_rows),
        {"full logits": 576.254638671875, "one pass": 576.2545776367188, "chunked": 576.254638671875},
    )


@pytest.mark.parametrize("chunk_tokens", [0, CHUNK], ids=["full-logits", "hidden-states"])
def test_sft_evaluation_is_pinned(pinned_model: Any, pinned_rows: list[Row], chunk_tokens: int) -> None:
    assert_pinned(
        measure_sft_eval(pinned_model, pinned_rows, chunk_tokens),
        {
            "loss": 7.387880190824851,
            "perplexity": 1616.2762816327381,
            "token_accuracy": 26 / 78,
            "loss_sum": 576.2546548843384,
            "target_tokens": 78,
            "correct_tokens": 26,  # every greedy token, no random one
            "examples": 5,
        },
    )


def test_a_dense_model_has_no_router_balance_and_trains_as_pinned(pinned_model: Any) -> None:
    from config.sections.model_train import TrainConfig
    from tests.unit.trainer.objectives.pinned import ONE
    from trainer.objectives.sft import Sft

    sft = Sft.of(TrainConfig())
    sft.start(pinned_model, None, ONE, 0)  # type: ignore[arg-type]  # SFT's start reads no spec
    assert sft.router is None and sft.sum_keys == ("loss_sum",)


def moe_step(dist: Any, coef: float | None) -> dict[str, Any]:
    """One SFT micro-batch of a small Qwen3-MoE on this rank (rows differ by rank), its step ended on every rank."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    from config.sections.model_train import MoeConfig, TrainConfig
    from tests.published import QWEN3_30B_A3B, QWEN3_MOE_SCALED
    from trainer.data import collate
    from trainer.objectives.sft import Sft

    torch.manual_seed(0)
    fields = {k: v for k, v in {**QWEN3_30B_A3B, **QWEN3_MOE_SCALED}.items() if k not in ("architectures",)}
    model = AutoModelForCausalLM.from_config(Qwen3MoeConfig(**{**fields, "vocab_size": 256}))
    sft = Sft.of(TrainConfig(moe=MoeConfig(aux_loss_coef=coef)))
    sft.start(model, None, dist, 0)  # type: ignore[arg-type]
    generator = torch.Generator().manual_seed(10 + dist.rank)
    rows = [
        Row(ids, ids, [len(ids)]) for ids in (torch.randint(1, 256, (n,), generator=generator).tolist() for n in (9, 5))
    ]
    batch = collate(rows, pad_id=0)
    scope = sft.begin_step(model, [batch], dist)
    micro = sft.micro_batch(model, batch, scope)
    counts = sft.router.counts.clone()  # type: ignore[union-attr]
    sums = {key: float(micro.sums[key]) for key in sft.sum_keys}
    from trainer.parallel.distributed import dist_sum

    reduced = dict(zip(sft.sum_keys, dist_sum(list(sums.values()), dist), strict=True))
    result = sft.end_step(reduced, scope)
    lm = float(micro.sums["loss_sum"]) * scope.scale
    return {
        "metrics": result.metrics,
        "loss": result.loss,
        "counts": counts,
        "sums": sums,
        "backward": float(micro.backward),
        "lm": lm,
    }


# Two launches of 2 gloo ranks (the coefficient on, then off): about a minute, so in the multirun suite.
@pytest.mark.multirun
def test_a_mixture_of_experts_adds_its_weighted_balancing_loss_and_reports_it_and_the_load_apart() -> None:
    """2 gloo ranks, each routing its own rows: the load-balancing loss, weighted by the config's
    router_aux_loss_coef (0.001), is added to backward only; metrics.jsonl gets it and the load over both ranks."""
    from tests.gloo import on_ranks

    ranks = on_ranks(moe_step, 2, None)
    counts = ranks[0]["counts"] + ranks[1]["counts"]  # (layers, experts), the padding of the shorter row left out
    assert counts.shape == (2, 8) and counts.sum(dim=1).tolist() == [2 * 14 * 2] * 2  # 14 real tokens, 2 experts each
    mean = counts.mean(dim=1)
    for rank in ranks:
        aux = rank["sums"]["aux_loss_sum"]
        assert rank["backward"] == pytest.approx(rank["lm"] + 0.001 * aux, rel=1e-6)
        assert rank["metrics"]["aux_loss"] == pytest.approx(
            (ranks[0]["sums"]["aux_loss_sum"] + ranks[1]["sums"]["aux_loss_sum"]) / 2
        )
        assert rank["metrics"]["expert_load_max"] == pytest.approx(float((counts.max(dim=1).values / mean).max()))
        assert rank["metrics"]["experts_idle"] == float((counts == 0).sum())
        assert rank["loss"] == ranks[0]["loss"]  # the language model's loss alone, the same on every rank
    off = on_ranks(moe_step, 2, 0.0)
    assert off[0]["backward"] == pytest.approx(off[0]["lm"], rel=1e-7) and off[0]["metrics"]["aux_loss"] > 0
