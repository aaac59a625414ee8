"""The preference objectives' metric sums (trainer/objectives/preference/sums.py): a micro-batch of pairs is right where
the chosen reward is strictly the higher, a KTO answer where its reward's sign is its label's, the desirable answers
counting as chosen; `metrics_of` divides the sums once (so the metrics of micro-batches added are those of the whole
batch), a zero denominator gives 0, and the loss is the units' mean plus ORPO's cross-entropy per token."""

from __future__ import annotations

import pytest
import torch

from trainer.objectives.preference.sums import PairLogps, PreferenceSums, feedback_sums, metrics_of


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_a_pair_is_right_when_its_chosen_reward_is_strictly_higher() -> None:
    pairs = PairLogps(t(-10.0, -4.0, -6.0), t(-12.0, -5.0, -3.0), t(5, 2, 3), t(6, 2, 1))
    sums = pairs.sums(t(1.0, 0.5, -2.0), t(0.0, 0.5, -1.0))
    assert PreferenceSums.of(sums.values()) == PreferenceSums(
        units=3,
        correct=1.0,  # the tie (0.5, 0.5) is not right
        chosen_reward_sum=-0.5,
        chosen_count=3,
        rejected_reward_sum=-0.5,
        rejected_count=3,
        chosen_logp_sum=-20.0,
        chosen_tokens=10.0,
        rejected_logp_sum=-20.0,
        rejected_tokens=9.0,
    )
    assert (sums.loss_sum, sums.nll_sum, sums.nll_tokens) == (0.0, 0.0, 0.0)  # the objective's own, set after


def test_a_kto_answer_is_right_when_its_rewards_sign_is_its_label() -> None:
    desirable = torch.tensor([True, True, False, False, True])
    sums = feedback_sums(t(0.5, -0.2, -1.0, 0.3, 0.0), t(-3.0, -4.0, -5.0, -6.0, -7.0), t(2, 3, 4, 5, 6), desirable)
    s = PreferenceSums.of(sums.values())
    assert s.units == 5
    assert s.correct == 2.0  # 0.5 (desirable) and -1.0 (undesirable); a zero reward is not positive
    assert (s.chosen_count, s.rejected_count) == (3.0, 2.0)
    assert s.chosen_reward_sum == pytest.approx(0.3) and s.rejected_reward_sum == pytest.approx(-0.7)
    assert (s.chosen_logp_sum, s.chosen_tokens) == (-14.0, 11.0)
    assert (s.rejected_logp_sum, s.rejected_tokens) == (-11.0, 9.0)


def test_the_metrics_are_the_sums_divided_once() -> None:
    sums = PreferenceSums(
        units=4.0,
        correct=3.0,
        loss_sum=2.0,
        nll_sum=30.0,
        nll_tokens=12.0,
        chosen_reward_sum=2.0,
        chosen_count=4.0,
        rejected_reward_sum=-1.0,
        rejected_count=4.0,
        chosen_logp_sum=-40.0,
        chosen_tokens=20.0,
        rejected_logp_sum=-45.0,
        rejected_tokens=15.0,
    )
    assert metrics_of(sums) == {
        "loss": 0.5 + 2.5,
        "reward_accuracy": 0.75,
        "reward_margin": 0.5 + 0.25,
        "chosen_reward": 0.5,
        "rejected_reward": -0.25,
        "chosen_logps_per_token": -2.0,
        "rejected_logps_per_token": -3.0,
        "units": 4,
    }


def test_zero_denominators_give_zero_not_an_error() -> None:
    metrics = metrics_of(PreferenceSums(units=2.0, loss_sum=1.0, nll_sum=5.0))
    assert metrics["loss"] == 0.5  # no nll tokens: no cross-entropy term
    assert all(metrics[key] == 0.0 for key in ("chosen_reward", "rejected_reward", "chosen_logps_per_token"))


def test_micro_batches_added_give_the_whole_batchs_metrics() -> None:
    reward, policy = t(0.4, -0.1, 0.2, -0.6, 0.9), t(-8.0, -9.0, -3.0, -2.0, -5.0)
    counts, desirable = t(4, 3, 2, 1, 5), torch.tensor([True, False, False, True, True])
    whole = feedback_sums(reward, policy, counts, desirable)
    added = PreferenceSums()
    for part in (slice(0, 2), slice(2, 5)):
        added = added.plus(feedback_sums(reward[part], policy[part], counts[part], desirable[part]))
    assert metrics_of(added) == pytest.approx(metrics_of(whole))
    assert metrics_of(added)["chosen_logps_per_token"] == pytest.approx(-15.0 / 10.0)
