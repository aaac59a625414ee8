"""GRPO's loss (trainer/objectives/rl/loss.py) and its gradient on a fixed batch equal TRL 1.16's, pinned as numbers:
every loss_type x scale_rewards x beta (0, 0.04) x num_iterations (1: old log-probabilities the policy's own, detached;
2: a window's old ones, the ratio away from 1), with epsilon 0.2 and epsilon_high 0.28, within 1e-5.

The batch: 2 prompts x G = 4 completions of at most 5 tokens (lengths 5, 3, 4, 5, 2, 5, 1, 4), in 2 micro-batches of
4 on one rank; two reward functions weighted 1 and 0.5, one reward None. The literals were computed by
GRPOTrainer._compute_loss itself (trl==1.16.0, installed apart with `pip install --no-deps --target DIR trl==1.16.0`),
called on each micro-batch with a stand-in trainer whose `_get_per_token_logps_and_entropies` returns these
log-probabilities, and its `sum_then_normalize` advantages on these rewards with TRL's `nanstd`; each case pins the
step's loss (the micro-batches' losses summed, as the accumulation does), and its gradient with respect to the
per-token log-probabilities: its sum, its dot product with a fixed probe and its absolute sum.
"""

from __future__ import annotations

import pytest
import torch

from config.sections.rl import RlConfig
from trainer.objectives.rl.advantages import advantages
from trainer.objectives.rl.loss import LossCounts, RlSums, metric_sums, per_token_loss, share, step_metrics

G, PROMPTS, T, MICRO = 4, 2, 5, 4
N = G * PROMPTS
TOLERANCE = 1e-5
LENGTHS = [5, 3, 4, 5, 2, 5, 1, 4]
NAN = float("nan")
REWARDS = torch.tensor([[1.0, 0.2], [0.0, 0.9], [1.0, NAN], [0.0, 0.1], [0.0, 0.3], [0.0, 0.3], [1.0, 0.7], [1.0, 0.0]])
WEIGHTS = torch.tensor([1.0, 0.5])

# (loss, gradient sum, gradient . probe, |gradient| sum), from TRL 1.16 (module docstring).
TRL = {
    "dapo-group-0.0-1": (0.0842733, 0.0842733, -0.2146024, 0.8270003),
    "dapo-group-0.0-2": (0.072811, 0.0383709, -0.1901525, 0.820412),
    "dapo-group-0.04-1": (0.0854236, 0.0826156, -0.2170098, 0.8273769),
    "dapo-group-0.04-2": (0.0739612, 0.0367132, -0.19256, 0.8210386),
    "dapo-batch-0.0-1": (0.100944, 0.100944, -0.2024568, 0.8664365),
    "dapo-batch-0.0-2": (0.0927276, 0.0543688, -0.1699069, 0.8552732),
    "dapo-batch-0.04-1": (0.1020942, 0.0992863, -0.2048643, 0.8668131),
    "dapo-batch-0.04-2": (0.0938778, 0.0527111, -0.1723143, 0.8558999),
    "dapo-none-0.0-1": (0.0517241, 0.0517241, -0.1037397, 0.4439655),
    "dapo-none-0.0-2": (0.047514, 0.0278588, -0.087061, 0.4382454),
    "dapo-none-0.04-1": (0.0528744, 0.0500664, -0.1061471, 0.4443422),
    "dapo-none-0.04-2": (0.0486642, 0.0262011, -0.0894684, 0.4388721),
    "grpo-group-0.0-1": (-0.0, -0.0, -0.21044, 0.8276033),
    "grpo-group-0.0-2": (-0.0155483, -0.0459408, -0.195082, 0.8110935),
    "grpo-group-0.04-1": (0.0010938, -0.0007674, -0.212339, 0.8280864),
    "grpo-group-0.04-2": (-0.0144545, -0.0467081, -0.196981, 0.8118787),
    "grpo-batch-0.0-1": (0.0, 0.0, -0.2055574, 0.8904107),
    "grpo-batch-0.0-2": (-0.0141459, -0.0471602, -0.185409, 0.8692952),
    "grpo-batch-0.04-1": (0.0010938, -0.0007673, -0.2074564, 0.8908938),
    "grpo-batch-0.04-2": (-0.013052, -0.0479275, -0.187308, 0.8700804),
    "grpo-none-0.0-1": (0.0, 0.0, -0.1053284, 0.45625),
    "grpo-none-0.0-2": (-0.0072484, -0.024165, -0.0950043, 0.4454304),
    "grpo-none-0.04-1": (0.0010938, -0.0007673, -0.1072274, 0.4567331),
    "grpo-none-0.04-2": (-0.0061545, -0.0249324, -0.0969033, 0.4462155),
    "dr_grpo-group-0.0-1": (0.0610982, 0.0610982, -0.1555867, 0.5995752),
    "dr_grpo-group-0.0-2": (0.052788, 0.0278189, -0.1378606, 0.5947987),
    "dr_grpo-group-0.04-1": (0.0619321, 0.0598963, -0.1573321, 0.5998483),
    "dr_grpo-group-0.04-2": (0.0536219, 0.0266171, -0.139606, 0.5952531),
    "dr_grpo-batch-0.0-1": (0.0731844, 0.0731844, -0.1467812, 0.6281664),
    "dr_grpo-batch-0.0-2": (0.0672275, 0.0394174, -0.1231825, 0.6200731),
    "dr_grpo-batch-0.04-1": (0.0740183, 0.0719826, -0.1485266, 0.6284395),
    "dr_grpo-batch-0.04-2": (0.0680614, 0.0382156, -0.1249279, 0.6205274),
    "dr_grpo-none-0.0-1": (0.0375, 0.0375, -0.0752113, 0.321875),
    "dr_grpo-none-0.0-2": (0.0344476, 0.0201976, -0.0631192, 0.317728),
    "dr_grpo-none-0.04-1": (0.0383339, 0.0362982, -0.0769567, 0.3221481),
    "dr_grpo-none-0.04-2": (0.0352816, 0.0189958, -0.0648646, 0.3181823),
    "bnpo-group-0.0-1": (0.1030765, 0.1030765, -0.1776471, 0.8185948),
    "bnpo-group-0.0-2": (0.0976237, 0.0599964, -0.1426709, 0.8054529),
    "bnpo-group-0.04-1": (0.1042247, 0.1012833, -0.1800734, 0.8191594),
    "bnpo-group-0.04-2": (0.0987719, 0.0582032, -0.1450972, 0.8062305),
    "bnpo-batch-0.0-1": (0.1231699, 0.1231699, -0.1662715, 0.8735496),
    "bnpo-batch-0.0-2": (0.1212998, 0.0787763, -0.1217273, 0.8550889),
    "bnpo-batch-0.04-1": (0.1243181, 0.1213766, -0.1686979, 0.874114),
    "bnpo-batch-0.04-2": (0.122448, 0.076983, -0.1241536, 0.8558666),
    "bnpo-none-0.0-1": (0.0631128, 0.0631128, -0.0851982, 0.4476103),
    "bnpo-none-0.0-2": (0.0621545, 0.0403653, -0.0623735, 0.4381509),
    "bnpo-none-0.04-1": (0.0642609, 0.0613195, -0.0876246, 0.4481747),
    "bnpo-none-0.04-2": (0.0633027, 0.038572, -0.0647999, 0.4389286),
}


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log-probabilities, old ones, reference ones, entropies, the mask), drawn as the reference script drew them."""
    gen = torch.Generator().manual_seed(1234)
    logps = -torch.rand(N, T, generator=gen, dtype=torch.float64).float() * 3 - 0.05
    old = logps + (torch.rand(N, T, generator=gen) - 0.5) * 0.6
    ref = logps + (torch.rand(N, T, generator=gen) - 0.5) * 0.8
    entropy = torch.rand(N, T, generator=gen) * 2
    mask = torch.zeros(N, T)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1
    return logps, old, ref, entropy, mask


def step(rl: RlConfig, iterations: int) -> tuple[torch.Tensor, torch.Tensor, RlSums]:
    """The step's loss (its micro-batches' shares summed), the gradient w.r.t. the log-probabilities, the sums."""
    logps, old, ref, entropy, mask = batch()
    leaf = logps.clone().requires_grad_(True)
    adv, _ = advantages(REWARDS, WEIGHTS, G, rl.scale_rewards)
    counts = LossCounts(float(N), float(mask.sum()), N // MICRO)
    total, sums = torch.zeros(()), RlSums()
    for start in range(0, N, MICRO):
        rows = slice(start, start + MICRO)
        mine = leaf[rows]
        before = old[rows] if iterations > 1 else mine.detach()
        loss, ratio, kl = per_token_loss(mine, before, ref[rows] if rl.beta else None, adv[rows], rl)
        total = total + share(loss, mask[rows], rl, counts)
        sums = sums.plus(metric_sums(ratio, kl, entropy[rows], adv[rows], mask[rows], rl))
    total.backward()
    assert leaf.grad is not None
    return total.detach(), leaf.grad, sums


def probe() -> torch.Tensor:
    return torch.sin(torch.arange(N * T, dtype=torch.float32).view(N, T) * 0.7 + 0.3)


@pytest.mark.parametrize("key", sorted(TRL))
def test_the_loss_and_its_gradient_equal_trl(key: str) -> None:
    loss_type, scale, beta, iterations = key.split("-")
    rl = RlConfig.model_validate(
        {
            "loss_type": loss_type,
            "scale_rewards": scale,
            "beta": float(beta),
            "epsilon_high": 0.28,
            "max_completion_length": T,
        }
    )
    loss, grad, _ = step(rl, int(iterations))
    got = (float(loss), float(grad.sum()), float((grad * probe()).sum()), float(grad.abs().sum()))
    assert got == pytest.approx(TRL[key], abs=TOLERANCE), key


def test_the_step_metrics_are_token_weighted_over_the_batch() -> None:
    """KL, entropy and the clipped shares: sums over every mask token of the step, divided once (TRL logs each
    micro-batch's mean and averages those: 0.0290 and 0.0284 for the KL here, against the batch's 0.0287)."""
    rl = RlConfig.model_validate({"beta": 0.04, "epsilon_high": 0.28})
    _, _, sums = step(rl, 2)
    metrics = step_metrics(sums, rl)
    logps, _, ref, entropy, mask = batch()
    kl = torch.exp(ref - logps) - (ref - logps) - 1
    assert metrics["kl"] == pytest.approx(float((kl * mask).sum() / mask.sum()), rel=1e-6)
    assert metrics["entropy"] == pytest.approx(float((entropy * mask).sum() / mask.sum()), rel=1e-6)
    assert metrics["clip_ratio/high_mean"] == 0.0
    # TRL: 1 of 17 tokens, then 1 of 12, clipped below (0.0588 and 0.0833 logged): 2 of the batch's 29.
    assert metrics["clip_ratio/region_mean"] == metrics["clip_ratio/low_mean"] == pytest.approx(2 / 29)


def test_without_beta_no_kl_is_reported() -> None:
    rl = RlConfig()
    _, _, sums = step(rl, 1)
    assert "kl" not in step_metrics(sums, rl)
    assert step_metrics(sums, rl)["clip_ratio/region_mean"] == 0.0  # a ratio of exactly 1 is never clipped


def test_token_log_probabilities_are_taken_at_the_temperature() -> None:
    from trainer.objectives.rl.loss import token_logps

    logits = torch.tensor([[[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]]])
    ids = torch.tensor([[0, 2]])
    logps, entropy = token_logps(logits, ids, 0.5)
    expected = torch.log_softmax(logits / 0.5, dim=-1)
    assert torch.allclose(logps, expected.gather(-1, ids.unsqueeze(-1)).squeeze(-1))
    assert torch.allclose(entropy, -(expected.exp() * expected).sum(-1))
