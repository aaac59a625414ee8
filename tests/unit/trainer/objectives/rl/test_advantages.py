"""Group-relative advantages (trainer/objectives/rl/advantages.py) equal TRL 1.16's on a fixed batch of rewards (two
functions weighted 1 and 0.5, one None), for each scale_rewards, pinned as numbers; the metrics TRL logs of them."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.objectives.rl.advantages import advantages, length_metrics, nanstd, reward_metrics

NAN = float("nan")
REWARDS = torch.tensor([[1.0, 0.2], [0.0, 0.9], [1.0, NAN], [0.0, 0.1], [0.0, 0.3], [0.0, 0.3], [1.0, 0.7], [1.0, 0.0]])
WEIGHTS = torch.tensor([1.0, 0.5])
# TRL 1.16's `sum_then_normalize` advantages of these rewards (tests/unit/trainer/objectives/rl/test_loss.py says how
# they were computed).
TRL = {
    "group": [0.9151997, -0.4067554, 0.711822, -1.220266, -0.8416958, -0.8416958, 1.1291041, 0.5542874],
    "batch": [0.8782133, -0.390317, 0.6830548, -1.1709509, -1.0001874, -1.0001874, 1.3417146, 0.6586599],
    "none": [0.45, -0.2, 0.35, -0.6, -0.5125, -0.5125, 0.6875, 0.3375],
}


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_equal_trl(scale: str) -> None:
    got, zero = advantages(REWARDS, WEIGHTS, 4, scale)  # type: ignore[arg-type]
    assert got.tolist() == pytest.approx(TRL[scale], abs=1e-6)
    assert not zero.any()


def test_a_group_without_spread_has_no_advantage_and_is_counted() -> None:
    rewards = torch.tensor([[1.0], [1.0], [0.0], [1.0]])
    got, zero = advantages(rewards, torch.ones(1), 2, "group")
    assert got[:2].tolist() == [0.0, 0.0] and zero.tolist() == [True, True, False, False]
    metrics = reward_metrics(rewards, torch.ones(1), ["r"], zero)
    assert metrics["frac_reward_zero_std"] == 0.5
    assert metrics["reward"] == metrics["rewards/r/mean"] == 0.75


def test_an_unscorable_completion_gets_advantage_0_and_stays_out_of_its_group() -> None:
    rewards = torch.tensor([[NAN], [1.0], [0.0], [0.5]])
    got, _ = advantages(rewards, torch.ones(1), 4, "none")
    assert got[0] == 0.0 and got[1:].tolist() == pytest.approx([0.5, -0.5, 0.0])


def test_nanstd_is_bessel_corrected_and_ignores_nan() -> None:
    assert float(nanstd(torch.tensor([1.0, NAN, 3.0]))) == pytest.approx(math.sqrt(2))
    assert math.isnan(float(nanstd(torch.tensor([1.0, NAN]))))


def test_the_completion_length_metrics() -> None:
    metrics = length_metrics([3, 5, 10], [True, True, False])
    assert metrics == {
        "completions/mean_length": 6.0,
        "completions/min_length": 3.0,
        "completions/max_length": 10.0,
        "completions/clipped_ratio": pytest.approx(1 / 3),
    }
