"""Group-relative advantages and the rollouts' reward metrics, from every completion's rewards of the global batch:
TRL 1.16's `_generate_and_score_completions` written out (its default `sum_then_normalize` aggregation).

A completion's reward is its functions' rewards weighted and summed, NaN ones (None: not applicable) left out; a
completion whose every reward is NaN is unscorable: NaN, out of its group's mean and deviation, and advantage 0. Its
advantage is its reward minus its group's mean (a group: the G completions of one prompt, rows p*G .. p*G+G-1),
divided by the standard deviation plus 1e-4: of its group (scale_rewards=group), of the whole batch (batch), or not
divided (none). Deviations are Bessel-corrected (TRL's `nanstd`). Computed over whole groups of the global batch on
every rank alike, never over one rank's part.
"""

from __future__ import annotations

import torch

from config.sections.rl import ScaleRewards

STD_EPSILON = 1e-4


def nanstd(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The Bessel-corrected standard deviation ignoring NaNs (TRL's `nanstd`): NaN with fewer than two values."""
    mean = torch.nanmean(values, dim=dim, keepdim=True)
    variance = torch.nanmean((values - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(values), dim=dim, keepdim=True)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(variance, float("nan")))
    std = torch.sqrt(variance * correction)
    return std.squeeze() if dim is None else std.squeeze(dim)


def total_rewards(per_function: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each completion's weighted sum of its functions' rewards (NaN ones left out); NaN when all are."""
    rewards = (per_function * weights.unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(per_function).all(dim=1)] = torch.nan
    return rewards


def advantages(
    per_function: torch.Tensor, weights: torch.Tensor, group: int, scale: ScaleRewards
) -> tuple[torch.Tensor, torch.Tensor]:
    """(each completion's advantage, whether its scale's deviation is zero) from its functions' rewards (rows x
    functions, float32, NaN for None), `group` completions a prompt."""
    rewards = total_rewards(per_function, weights)
    mean = torch.nanmean(rewards.view(-1, group), dim=1).repeat_interleave(group)
    if scale == "batch":
        std = nanstd(rewards).expand_as(rewards)
    else:  # group, and none (whose deviation is only logged)
        std = nanstd(rewards.view(-1, group), dim=1).repeat_interleave(group)
    out = rewards - mean
    if scale != "none":
        out = out / (std + STD_EPSILON)
    zero = torch.isclose(std, torch.zeros_like(std))
    return torch.nan_to_num(out, nan=0.0), zero


def reward_metrics(
    per_function: torch.Tensor, weights: torch.Tensor, names: list[str], zero_std: torch.Tensor
) -> dict[str, float]:
    """The rollouts' reward metrics under TRL's names: each function's mean and deviation, the total's, and the share
    of completions whose group (or batch) has no spread in reward (no signal to learn from)."""
    out: dict[str, float] = {}
    for k, name in enumerate(names):
        out[f"rewards/{name}/mean"] = float(torch.nanmean(per_function[:, k]))
        out[f"rewards/{name}/std"] = float(nanstd(per_function[:, k]))
    rewards = total_rewards(per_function, weights)
    out["reward"] = float(torch.nanmean(rewards))
    out["reward_std"] = float(nanstd(rewards))
    out["frac_reward_zero_std"] = float(zero_std.float().mean())
    return out


def length_metrics(lengths: list[int], ended: list[bool]) -> dict[str, float]:
    """The completions' lengths (tokens, the stop token counted) and the share that ran out of tokens, TRL's names."""
    tensor = torch.tensor(lengths, dtype=torch.float32)
    return {
        "completions/mean_length": float(tensor.mean()),
        "completions/min_length": float(tensor.min()),
        "completions/max_length": float(tensor.max()),
        "completions/clipped_ratio": 1.0 - sum(ended) / max(len(ended), 1),
    }
