"""What the preference objectives share (trainer/objectives/preference/objective.py), apart from each unit's loss: which
of them read reference tables; an evaluation's passes (row i on rank i % world, ZeRO-3's extra passes over the first
row, a KTO row's partner the next row); the step's global counts, and a micro-batch's loss as its share of the global
batch's mean, so that micro-batches of any size add up to the same step loss; the step's result from the sums; and an
evaluation that is the same in any batch size and on the throw-away passes. DPO under full fine-tuning, its reference
read from a table (the per-unit loss is DPO's, pinned elsewhere), on a bigram model in plain torch: what is tested here
does not depend on the model, which only gives the logits."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from config.methods import FULL, LORA
from config.objectives import DPO, objective_named
from config.sections.model_train import TrainConfig
from core.errors import UserError
from storage.shards import IGNORE_INDEX, PAIR, Row
from storage.split_reader import Split
from tests.unit.trainer.objectives.preference.test_batching import pref_row, staged
from trainer.objectives.base import EvalOptions
from trainer.objectives.policy import Policy
from trainer.objectives.preference.batching import collate_preference
from trainer.objectives.preference.objective import EvalPasses
from trainer.objectives.preference.pairs import Orpo
from trainer.objectives.preference.reference_table import ReferenceTable
from trainer.objectives.preference.sums import PreferenceSums, metrics_of
from trainer.objectives.registry import build
from trainer.parallel.distributed import Dist

CPU, VOCAB = torch.device("cpu"), 50
ONE = Dist(rank=0, local_rank=0, world_size=1, node_rank=0, host="test", device=CPU)
TABLE = ReferenceTable(-np.arange(12.0).reshape(6, 2) - 20.0)  # the base's log-probabilities of 6 pairs


def of(objective: str, method: str) -> Any:
    return build(TrainConfig.model_validate({"objective": objective, "method": method, "preference": {"beta": 0.4}}))


def dpo_full() -> Any:
    objective = of("dpo", "full")
    objective.tables = {"train": TABLE, "eval": TABLE}
    return objective


class Bigram(torch.nn.Module):
    """Each position's next-token logits from its own token, as a model's output (`.logits`)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = torch.nn.Embedding(VOCAB, 8), torch.nn.Linear(8, VOCAB)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, use_cache: bool = True) -> Any:
        """A causal LM's call as the trainer makes it (`use_cache` off in training and evaluation forwards)."""
        return SimpleNamespace(logits=self.head(torch.tanh(self.embed(input_ids))))


@pytest.fixture(scope="module")
def model() -> Any:
    return Bigram()


@pytest.fixture
def pairs(tmp_path: Any) -> Split:
    """6 pairs of random tokens: chosen answers of 1..6 tokens, rejected ones of 4, 3, 2, 1, 4, 3."""
    generator, rows = torch.Generator().manual_seed(6), []
    for k in range(6):
        p, c, r = 2 + k % 3, 1 + k, 4 - k % 4
        ids = torch.randint(2, VOCAB, (p + c + r,), generator=generator).tolist()
        rows.append(Row(ids, [IGNORE_INDEX] * p + ids[p:], [p, c, r]))
    return staged(tmp_path, rows, [PAIR] * 6)


def test_only_a_reference_under_full_fine_tuning_reads_tables() -> None:
    methods = [("dpo", "full"), ("ipo", "full"), ("dpo", "lora"), ("kto", "qlora"), ("orpo", "full")]
    assert [of(*pair).reads_tables for pair in methods] == [True, True, False, False, False]
    lora = of("dpo", "lora")
    assert (lora.beta, lora.method) == (0.4, LORA)
    lora.start(SimpleNamespace(engine=None, pad_id=0), None, ONE)  # nothing to read: no engine, no spec asked for
    lora.start_evaluation(None, None)
    assert lora.tables == {}


def test_an_evaluations_passes_deal_rows_by_rank_with_throw_away_passes(tmp_path: Any) -> None:
    kto = staged(tmp_path, [pref_row(k, (1, 1 + k % 2, 0)) for k in range(7)], [k % 2 for k in range(7)])
    rank2 = Dist(rank=2, local_rank=0, world_size=3, node_rank=2, host="test", device=CPU)
    plan = EvalPasses.of(kto, range(7), rank2, EvalOptions(2, 0, lockstep=True))
    assert (plan.groups, plan.passes, plan.partner[6], plan.partner[2]) == ([[2, 5]], 2, 0, 3)
    assert EvalPasses.of(kto, range(7), rank2, EvalOptions(2, 0)).passes == 1
    first, extra = plan.batch(0), plan.batch(1)
    assert first.indices == (2, 5) and extra.indices == (0,)  # the throw-away pass: the first row
    assert first.mismatched is not None and first.mismatched.input_ids[1, :2].tolist() == [500, 1600]  # row 6's answer
    with pytest.raises(UserError, match="no eval rows to evaluate") as info:
        EvalPasses.of(kto, [], ONE, EvalOptions(2, 0))
    assert "\n" not in str(info.value)


def test_micro_batches_of_any_size_add_up_to_the_global_batchs_mean_loss(model: Any, pairs: Split) -> None:
    objective, policy = dpo_full(), Policy(model, CPU)
    steps = []
    for sizes in ([4], [1, 3], [2, 1, 1]):
        starts = np.cumsum([0, *sizes])
        groups = [list(range(a, b)) for a, b in itertools.pairwise(starts)]
        batches = [collate_preference([pairs[i] for i in g], [PAIR] * len(g), 0, indices=g) for g in groups]
        scope = objective.begin_step(policy, batches, ONE)
        assert (scope.units, scope.accumulation, scope.kl, scope.table) == (4, len(sizes), 0.0, TABLE)
        assert scope.chosen_tokens == sum(b.chosen_tokens for b in batches) == 1 + 2 + 3 + 4
        sums = PreferenceSums()
        total = 0.0  # the step's loss: the backward losses, DeepSpeed's averaging over the accumulation undone
        for batch in batches:
            micro = objective.micro_batch(policy, batch, scope)
            losses = objective.unit_losses(policy, batch, scope).losses
            backward = float(micro.backward.detach())  # its units' summed loss over the global units, x accumulation
            assert backward == pytest.approx(float(losses.detach().sum()) / 4 * len(sizes), rel=1e-6)
            assert micro.backward.requires_grad and micro.sums.nll_tokens == 0.0
            total += backward / scope.accumulation
            sums = sums.plus(micro.sums)
        sums = PreferenceSums.of(sums.values())  # the step reads the device's sums once (trainer/step.py)
        result = objective.end_step(sums, scope)
        assert result.loss == pytest.approx(total, rel=1e-6) == metrics_of(sums)["loss"]
        assert result.target_tokens == int(sums.chosen_tokens + sums.rejected_tokens) == 10 + 10
        assert set(result.metrics) == {"reward_accuracy", "reward_margin"}
        steps.append([result.loss, result.metrics["reward_margin"]])
    assert steps[1] == pytest.approx(steps[0], rel=1e-6) and steps[2] == pytest.approx(steps[0], rel=1e-6)


def test_an_evaluation_is_the_same_in_any_batch_size_and_without_throw_away_passes(model: Any, pairs: Split) -> None:
    objective, keys = dpo_full(), {*metrics_of(PreferenceSums()), "objective"}

    def evaluate(indices: Any, dist: Dist, batch_size: int, lockstep: bool = False) -> dict[str, Any]:
        return dict(objective.evaluate(model, pairs, indices, dist, EvalOptions(batch_size, 0, lockstep)))

    whole = evaluate(range(6), ONE, 4)
    assert whole == pytest.approx(evaluate(range(6), ONE, 1)) and set(whole) == keys
    assert (whole["objective"], whole["units"]) == ("dpo", 6)
    rank3 = Dist(rank=3, local_rank=0, world_size=4, node_rank=3, host="test", device=CPU)  # row 3, in 2 passes
    alone = evaluate([3], ONE, 1)
    assert evaluate(range(6), rank3, 1, lockstep=True) == pytest.approx(alone) and alone["units"] == 1
    assert alone != pytest.approx(whole)
    assert objective.summary(whole) == (
        f"eval dpo loss {whole['loss']:.4f} reward accuracy {whole['reward_accuracy']:.4f} "
        f"reward margin {whole['reward_margin']:.4f} over 6 units"
    )
    assert objective.eval_fields() == {"reference": DPO.reference_words(FULL)}


# A mixture of experts (Qwen3-30B-A3B scaled down, tests/published.py, vocabulary 256): the router's load-balancing
# loss is added to the preference objective's by the step (trainer/step.py), as to SFT's, and logged apart; ORPO needs
# no reference, and DPO, IPO and KTO share the code path (`unit_losses`, `micro_batch`).
@pytest.fixture(scope="module")
def moe_model() -> Any:
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    from tests.published import QWEN3_30B_A3B, QWEN3_MOE_SCALED

    torch.manual_seed(0)
    fields = {k: v for k, v in {**QWEN3_30B_A3B, **QWEN3_MOE_SCALED}.items() if k != "architectures"}
    return AutoModelForCausalLM.from_config(Qwen3MoeConfig(**{**fields, "vocab_size": 256})).float()


def moe_pairs() -> list[Row]:
    generator, out = torch.Generator().manual_seed(4), []
    for k in range(2):
        p, c, r = 3 + k, 2 + 2 * k, 4 - k
        ids = torch.randint(2, 256, (p + c + r,), generator=generator).tolist()
        out.append(Row(ids, [IGNORE_INDEX] * p + ids[p:], [p, c, r]))
    return out


def orpo_step(model: Any, coef: float | None, *, router: bool = True) -> tuple[Any, Any, dict[str, Any]]:
    """(the router balance, its micro-batch's loss for backward, the step's metrics) of one ORPO step of one
    micro-batch of 2 pairs, through the optimizer step (an engine that only runs backward)."""
    from tests.unit.trainer.test_step import Recorder
    from trainer.parallel.moe import RouterBalance
    from trainer.step import StepTools, optimizer_step
    from trainer.watch.faults import NO_FAULTS
    from trainer.watch.heartbeat import Heartbeat

    objective = Orpo.of(TrainConfig(objective=objective_named("orpo")))
    balance = RouterBalance.of(model.config, coef, ONE) if router else None
    batch = collate_preference(moe_pairs(), [PAIR, PAIR], 0, indices=[0, 1])
    engine, tools = Recorder(), StepTools(ONE, Heartbeat(0), NO_FAULTS)
    stats, metrics = optimizer_step(engine, Policy(model, CPU, balance), [batch], objective, tools, 1)
    return balance, engine.losses[0], {**metrics, "loss": stats.loss}


def test_the_weighted_balancing_loss_is_added_to_the_preference_loss_and_logged_apart(moe_model: Any) -> None:
    plain, plain_backward, plain_metrics = orpo_step(moe_model, None, router=False)
    assert plain is None and "aux_loss" not in plain_metrics
    moe_model.zero_grad()
    router, backward, metrics = orpo_step(moe_model, 0.25)
    assert router is not None and router.coef == 0.25
    aux = metrics["aux_loss"]
    assert aux > 0.0  # Switch's loss is experts x sum(share x probability): about 1 for a router near even
    # The total is the preference loss plus the coefficient times the auxiliary loss; the logged loss is ORPO's alone.
    assert backward == pytest.approx(plain_backward + 0.25 * aux, rel=1e-6)
    assert metrics["loss"] == pytest.approx(plain_metrics["loss"], rel=1e-6)
    assert metrics["expert_load_max"] >= 1.0 and metrics["experts_idle"] >= 0.0
    gate = moe_model.model.layers[0].mlp.gate.weight.grad  # the router got the balancing loss's gradient
    assert gate is not None and gate.abs().sum() > 0
    moe_model.zero_grad()


def test_the_model_configs_coefficient_is_the_default_and_zero_adds_nothing(moe_model: Any) -> None:
    router, _, _ = orpo_step(moe_model, None)
    assert router is not None and router.coef == 0.001  # Qwen3-30B-A3B's router_aux_loss_coef
    _, plain_backward, _ = orpo_step(moe_model, None, router=False)
    _, backward, metrics = orpo_step(moe_model, 0.0)
    assert metrics["aux_loss"] > 0.0  # measured and logged, not trained on
    assert backward == pytest.approx(plain_backward, rel=1e-6)
    moe_model.zero_grad()
