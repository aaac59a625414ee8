"""GRPO on a rank (trainer/objectives/rl/objective.py), on the tiny model with LoRA and prompt rows, without DeepSpeed:
a step's rollouts, rewards, advantages, loss and metrics; 2 gloo ranks give 1 rank's rollouts, loss and gradient
(each rank generating its rollout batches, the completions gathered); a window of num_iterations steps kept in the
objective's state and continued from it on a fresh objective, as a resume does; beta's reference, the policy with its
adapters off; a reward that raises stops the step in one line."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from core.errors import UserError
from storage.split_reader import Split
from tests.gloo import on_ranks
from tests.unit.trainer.objectives.rl.conftest import load_policy, started, write_prompts
from trainer.data import Dealing, GlobalOrder
from trainer.objectives.policy import Policy
from trainer.parallel.distributed import Dist, dist_sum

CPU = torch.device("cpu")
ONE = Dist(rank=0, local_rank=0, world_size=1, node_rank=0, host="test", device=CPU)
GLOBAL, MICRO = 8, 2  # 2 prompts x 4 completions a step, micro-batches of 2
SETTINGS = {"num_generations": 4, "rollout_batch_size": 2, "temperature": 0.7}


def run_step(grpo: Any, model: Any, rows: Split, dist: Dist, step: int = 0) -> tuple[Any, Any, list[float]]:
    """Step `step` on this rank: (its scope, the step's result, the global gradient of the loss, summed over ranks)."""
    accum = GLOBAL // MICRO // dist.world_size
    dealing = Dealing(step, MICRO, accum, dist.rank, dist.world_size, grpo.runtime.pad_id)
    slots = list(grpo.deal(rows, GlobalOrder(len(rows), 1), dealing))
    policy = Policy(model, CPU)
    model.zero_grad()
    scope = grpo.begin_step(policy, slots, dist)
    sums = grpo.sums_type()
    for slot in slots:
        micro = grpo.micro_batch(policy, slot, scope)
        (micro.backward / scope.scale).backward()  # the share itself: no DeepSpeed averaging to undo here
        sums = sums.plus(micro.sums)
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])
    result = grpo.end_step(sums.reduced(dist), scope)
    return scope, result, dist_sum(grads.tolist(), dist)


def test_a_step_scores_its_rollouts_and_reports_trls_metrics(tiny_model: str, prompts: Split) -> None:
    grpo, model = started(tiny_model, SETTINGS), load_policy(tiny_model)
    scope, result, grads = run_step(grpo, model, prompts, ONE)
    rollouts = scope.rollouts
    assert len(rollouts.completions) == GLOBAL and rollouts.rewards.shape == (GLOBAL, 2)
    texts = grpo.runtime.tokenizer.batch_decode(
        [c[:-1] if e else c for c, e in zip(rollouts.completions, rollouts.ended, strict=True)],
        skip_special_tokens=True,
    )
    chars = [len(t) / 10 for t in texts]
    assert rollouts.rewards[:, 1].tolist() == pytest.approx(chars)
    assert result.metrics["rewards/chars/mean"] == pytest.approx(sum(chars) / GLOBAL)
    for group in rollouts.advantages.view(-1, 4):
        assert float(group.sum()) == pytest.approx(0.0, abs=1e-5)  # group-relative
    assert result.target_tokens == sum(len(c) for c in rollouts.completions) == scope.counts.tokens
    assert {"reward", "reward_std", "frac_reward_zero_std", "entropy", "clip_ratio/region_mean"} <= set(result.metrics)
    assert {"completions/mean_length", "completions/clipped_ratio", "generation_s", "logps_s"} <= set(result.metrics)
    assert "kl" not in result.metrics and math.isfinite(result.loss) and any(g != 0 for g in grads)


def two_rank_step(dist: Dist, model_dir: str, folder: str) -> tuple[list[list[int]], float, list[float]]:
    from pathlib import Path

    rows = write_prompts(model_dir, Path(folder) / f"rank-{dist.rank}")
    scope, result, grads = run_step(started(model_dir, SETTINGS), load_policy(model_dir), rows, dist)
    return scope.rollouts.completions, result.loss, grads


def test_two_ranks_give_one_ranks_rollouts_loss_and_gradient(tiny_model: str, tmp_path: Any) -> None:
    one = two_rank_step(ONE, tiny_model, str(tmp_path / "one"))
    for completions, loss, grads in on_ranks(two_rank_step, 2, tiny_model, str(tmp_path / "two")):
        assert completions == one[0]
        assert loss == pytest.approx(one[1], rel=1e-5, abs=1e-7)
        assert torch.allclose(torch.tensor(grads), torch.tensor(one[2]), rtol=1e-5, atol=1e-7)


def test_a_window_is_kept_in_the_state_and_continued_by_a_fresh_objective(tiny_model: str, prompts: Split) -> None:
    settings = {**SETTINGS, "num_iterations": 2, "beta": 0.04}
    grpo, model = started(tiny_model, settings), load_policy(tiny_model)
    first, _, _ = run_step(grpo, model, prompts, ONE, step=0)
    state = grpo.state_dict()
    assert state is not None and state["rollouts"].old is not None and len(state["rollouts"].ref) == GLOBAL
    carried, uninterrupted = started(tiny_model, settings), run_step(grpo, model, prompts, ONE, step=1)
    carried.load_state_dict(state)
    resumed = run_step(carried, model, prompts, ONE, step=1)
    assert resumed[1].metrics["generation_s"] == 0.0 and resumed[0].rollouts is first.rollouts
    assert resumed[1].loss == uninterrupted[1].loss and resumed[1].metrics["kl"] == uninterrupted[1].metrics["kl"]
    fresh = started(tiny_model, settings)
    with pytest.raises(RuntimeError, match="inside a window whose rollouts were not restored"):
        run_step(fresh, model, prompts, ONE, step=1)


def test_beta_takes_the_reference_with_the_adapters_off(tiny_model: str, prompts: Split) -> None:
    from trainer.objectives.preference.reference import adapters_off
    from trainer.objectives.rl.logps import completion_logps

    grpo, model = started(tiny_model, {**SETTINGS, "beta": 0.1}), load_policy(tiny_model)
    slots = list(grpo.deal(prompts, GlobalOrder(len(prompts), 1), Dealing(0, MICRO, 4, 0, 1, 0)))
    policy = Policy(model, CPU)
    grpo.begin_step(policy, slots, ONE)
    assert all(slot.built is not None and slot.built.ref is not None for slot in slots)
    with torch.no_grad(), adapters_off(policy):
        base, _ = completion_logps(policy, slots[0].built, 0.7)
    with torch.no_grad():
        with_adapters, _ = completion_logps(policy, slots[0].built, 0.7)
    assert torch.equal(slots[0].built.ref, base) and not torch.allclose(base, with_adapters)
    assert grpo.state_dict() is None  # one step a window: nothing to keep


def test_a_reward_that_raises_stops_the_step_in_one_line(
    tiny_model: str, prompts: Split, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys
    import types

    module = types.ModuleType("tandem_broken_reward")

    def fails(**_: Any) -> list[float]:
        raise ValueError("no")

    module.fails = fails  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tandem_broken_reward", module)
    grpo, model = started(tiny_model, {**SETTINGS, "rewards": ["tandem_broken_reward:fails"]}), load_policy(tiny_model)
    with pytest.raises(UserError) as caught:
        run_step(grpo, model, prompts, ONE)
    assert str(caught.value).startswith("reward tandem_broken_reward:fails raised ValueError (no) scoring the ")
    assert "q.jsonl:" in str(caught.value) and caught.value.exit_code == 2
