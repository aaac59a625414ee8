"""Online RL with verifiable rewards (train.objective=grpo): GRPO, TRL 1.16's formulas, on the objective contract
(trainer/objectives/base.py).

    deal        (the step prefetch, weight-free) this rank's slots: the global rollout rows each micro-batch trains on,
                and the window's prompts (rollouts.py)
    begin_step  (every rank) at a window's first step, the rollouts: generated with the policy's current weights on
                every rank, scored, gathered, group advantages (advantages.py); with num_iterations > 1 the old
                log-probabilities of every row, with beta > 0 the reference's (logps.py); each slot's tensors
    micro_batch the policy's log-probabilities of the slot's completions and its share of the global batch's loss
                (loss.py), scaled for DeepSpeed's averaging
    end_step    the step's loss and metrics: the rollouts' (rewards, lengths), the loss's (KL, entropy, clipped shares),
                and the seconds spent generating, scoring and taking log-probabilities
    evaluate    answers to the eval prompts scored by the same reward functions (evaluation.py)

A global batch counts completions (TRL's generation batch): train.global_batch_size, a multiple of train.rl.
num_generations. Rollouts, rewards, advantages and the loss do not depend on the number of ranks or nodes, except
bnpo's normalisation, which is TRL's per micro-batch (docs/online-rl.md). With num_iterations > 1 a window's rollouts
are kept in checkpoints (`state_dict`), so a run resumed inside a window continues it exactly.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from config.methods import Method
from config.objectives import Objective
from config.sections.model_train import TrainConfig
from config.sections.rl import RlConfig
from core.errors import UserError
from storage.spec import Spec
from storage.split_reader import Split
from trainer.data import Dealing, GlobalOrder
from trainer.model.generation import Generator, Sampling, stop_ids, whole_weights
from trainer.objectives.base import EvalOptions, Metrics, MicroLoss, StepResult
from trainer.objectives.policy import Policy
from trainer.objectives.rl import advantages as adv
from trainer.objectives.rl import evaluation
from trainer.objectives.rl.logps import completion_logps, detached_logps, frozen_reference
from trainer.objectives.rl.loss import LossCounts, RlSums, metric_sums, per_token_loss, share, step_metrics
from trainer.objectives.rl.reward_funcs import RewardFn, Scored, load_rewards, score
from trainer.objectives.rl.rollouts import (
    Drawn,
    RolloutPlan,
    Rollouts,
    Slot,
    assemble,
    build_batch,
    deal_slots,
    generate_mine,
)
from trainer.parallel.distributed import Dist, gather_objects

if TYPE_CHECKING:
    from trainer.build import Built


@dataclass(frozen=True)
class RlScope:
    """A step's rollouts, what its loss shares are divided by, the scale of a share for backward (DeepSpeed's
    averaging over accumulation and ranks undone), and this rank's seconds of the step's phases."""

    rollouts: Rollouts
    counts: LossCounts
    scale: float
    seconds: dict[str, float]


@dataclass
class Runtime:
    """What `start` (or `start_evaluation`) resolves once: the tokenizer, the reward functions, the pad id, whether
    the policy is partitioned (ZeRO-3), the reference (a frozen copy under full fine-tuning), the run's seed and
    eval.generate's settings."""

    tokenizer: Any
    rewards: list[RewardFn]
    pad_id: int
    zero3: bool
    reference: Policy | None
    seed: int
    eval_settings: Any


class Grpo:
    """train.objective=grpo on a rank, with train.rl's settings."""

    sums_type: type[RlSums] = RlSums

    def __init__(self, objective: Objective, rl: RlConfig, method: Method) -> None:
        self.objective, self.rl, self.method = objective, rl, method
        self.runtime: Runtime | None = None
        self.rollouts: Rollouts | None = None

    @classmethod
    def of(cls, train: TrainConfig) -> Grpo:
        """GRPO with train.rl's settings."""
        return cls(train.objective, train.rl, train.method)

    def start(self, built: Built, spec: Spec, dist: Dist) -> None:
        """The tokenizer, the reward functions and, with beta > 0 under full fine-tuning, the frozen reference."""
        reference = None
        if self.rl.beta > 0 and not self.method.trains_adapters:
            trust = spec.config.model.trust_remote_code
            reference = frozen_reference(spec.model_path, dist.device, bf16=built.choices.bf16, trust_remote_code=trust)
        self.runtime = self._runtime(spec, built.pad_id, built.choices.zero3, reference)

    def start_evaluation(self, spec: Spec, rows: Split) -> None:
        """The tokenizer and the reward functions, for the evaluate stage (its model's pad id comes with it)."""
        self.runtime = self._runtime(spec, -1, False, None)

    def _runtime(self, spec: Spec, pad_id: int, zero3: bool, reference: Policy | None) -> Runtime:
        from transformers import AutoTokenizer

        trust = spec.config.model.trust_remote_code
        tokenizer = AutoTokenizer.from_pretrained(spec.model_path, trust_remote_code=trust)
        rewards = load_rewards(self.rl, spec.rewards, spec.run)
        return Runtime(tokenizer, rewards, pad_id, zero3, reference, spec.config.train.seed, spec.config.eval.generate)

    def deal(self, rows: Split, order: GlobalOrder, dealing: Dealing) -> Iterator[Slot]:
        """This rank's slots of the step: rollout rows, and the window's prompts (read here, a step ahead)."""
        return iter(deal_slots(rows, order, dealing, self.rl.num_generations, self.rl.num_iterations))

    def begin_step(self, policy: Policy, batches: Sequence[Slot], dist: Dist) -> RlScope:
        """The window's rollouts (generated at its first step), the slots' tensors and the global counts."""
        step, window = batches[0].step, batches[0].window
        seconds = {"generation_s": 0.0, "scoring_s": 0.0, "logps_s": 0.0}
        if self.rollouts is None or self.rollouts.window != window.window:
            if step % self.rl.num_iterations:
                raise RuntimeError(f"step {step + 1} is inside a window whose rollouts were not restored")
            self.rollouts = self._roll(policy, batches, dist, seconds)
        rollouts = self.rollouts
        started = time.perf_counter()
        for slot in batches:
            slot.built = build_batch(
                slot, rollouts, self.rl.num_generations, self._runtime_of().pad_id, self.rl.mask_truncated_completions
            )
            if self.rl.beta > 0 and rollouts.ref is None:  # one step a window: the reference's, per slot
                _, ref = detached_logps(policy, slot.built, self.rl.temperature, False, self._reference())
                slot.built = replace(slot.built, ref=ref)
        seconds["logps_s"] += time.perf_counter() - started
        counts = LossCounts(len(rollouts.completions), self._tokens(rollouts), len(batches) * dist.world_size)
        return RlScope(rollouts, counts, float(dist.gradient_ranks * len(batches)), seconds)

    def _runtime_of(self) -> Runtime:
        assert self.runtime is not None, "Grpo.start (or start_evaluation) runs before the first step"
        return self.runtime

    def _reference(self) -> tuple[Policy | None, bool]:
        """(the frozen reference copy, whether the reference is the policy with its adapters off)."""
        runtime = self._runtime_of()
        return runtime.reference, runtime.reference is None and self.method.trains_adapters

    def _tokens(self, rollouts: Rollouts) -> float:
        """The global batch's mask tokens (a truncated completion's are out with mask_truncated_completions)."""
        keep = [e or not self.rl.mask_truncated_completions for e in rollouts.ended]
        return float(sum(len(c) for c, k in zip(rollouts.completions, keep, strict=True) if k))

    def _roll(self, policy: Policy, slots: Sequence[Slot], dist: Dist, seconds: dict[str, float]) -> Rollouts:
        """A window's rollouts: generated (this rank's batches), scored, gathered, advantages; with num_iterations > 1
        every row's old (and reference) log-probabilities, gathered too."""
        runtime, window = self._runtime_of(), slots[0].window
        sampling = Sampling(self.rl.max_completion_length, self.rl.temperature, self.rl.top_p)
        plan = RolloutPlan(
            runtime.seed, self.rl.num_generations, self.rl.rollout_batch, sampling, dist.rank, dist.world_size
        )
        with whole_weights(policy.module, runtime.zero3) as model:
            generator = Generator(model, runtime.pad_id, stop_ids(model, runtime.tokenizer))
            drawn = generate_mine(generator, window, plan, lambda rows, done: self._score(window, rows, done))
        parts: list[Drawn] = gather_objects(drawn, dist)
        if errors := [part.error for part in parts if part.error]:
            raise UserError(errors[0])
        seconds["generation_s"], seconds["scoring_s"] = drawn.seconds
        completions, rewards = assemble(parts, len(window.prompts) * self.rl.num_generations)
        weights = torch.tensor(self.rl.weights, dtype=torch.float32)
        advantages, zero = adv.advantages(rewards, weights, self.rl.num_generations, self.rl.scale_rewards)
        names = [reward.name for reward in runtime.rewards]
        metrics = adv.reward_metrics(rewards, weights, names, zero)
        metrics |= adv.length_metrics([len(c.ids) for c in completions], [c.ended for c in completions])
        rollouts = Rollouts(window.window, [c.ids for c in completions], [c.ended for c in completions], rewards,
                            advantages, metrics)  # fmt: skip
        if self.rl.num_iterations > 1:
            started = time.perf_counter()
            rollouts = self._kept_logps(policy, slots, rollouts, dist)
            seconds["logps_s"] = time.perf_counter() - started
        return rollouts

    def _kept_logps(self, policy: Policy, slots: Sequence[Slot], rollouts: Rollouts, dist: Dist) -> Rollouts:
        """Every row's old (and reference) log-probabilities at the window's start, each rank its slots', gathered."""
        mine: dict[int, tuple[torch.Tensor | None, torch.Tensor | None]] = {}
        for slot in slots:
            built = build_batch(slot, rollouts, self.rl.num_generations, self._runtime_of().pad_id, False)
            reference = self._reference() if self.rl.beta > 0 else (None, False)
            old, ref = detached_logps(policy, built, self.rl.temperature, True, reference)
            for i, row in enumerate(slot.rows):
                length = len(rollouts.completions[row])
                mine[row] = (None if old is None else old[i, :length], None if ref is None else ref[i, :length])
        every = {row: pair for part in gather_objects(mine, dist) for row, pair in part.items()}
        old_rows = {row: pair[0] for row, pair in every.items() if pair[0] is not None}
        ref_rows = {row: pair[1] for row, pair in every.items() if pair[1] is not None}
        return replace(rollouts, old=old_rows, ref=ref_rows if self.rl.beta > 0 else None)

    def _score(self, window: Any, rows: list[int], completions: list[Any]) -> list[list[float]]:
        """The rewards of these rollout rows' completions (rows x functions, NaN for None)."""
        runtime = self._runtime_of()
        prompts = [window.prompts[r // self.rl.num_generations] for r in rows]
        ids = [c.ids[:-1] if c.ended else c.ids for c in completions]  # the text a reward reads ends at the stop
        texts = runtime.tokenizer.batch_decode(ids, skip_special_tokens=True)
        batch = Scored(
            [p.record["prompt"] for p in prompts],
            texts,
            [c.ids for c in completions],
            [p.record["columns"] for p in prompts],
            [p.record["location"] for p in prompts],
        )
        return score(runtime.rewards, batch)

    def micro_batch(self, policy: Policy, batch: Slot, scope: RlScope) -> MicroLoss[RlSums]:
        """The slot's share of the global batch's loss, scaled for backward, and its metric sums."""
        built = batch.built
        assert built is not None, "begin_step builds every slot's tensors"
        logps, entropy = completion_logps(policy, built, self.rl.temperature)
        device = logps.device
        mask, advantages = built.mask.to(device), built.advantages.to(device)
        old = logps.detach() if built.old is None else built.old.to(device)
        ref = None if built.ref is None else built.ref.to(device)
        loss, ratio, kl = per_token_loss(logps, old, ref, advantages, self.rl)
        part = share(loss, mask, self.rl, scope.counts)
        sums = replace(metric_sums(ratio, kl, entropy, advantages, mask, self.rl), loss_sum=part.detach())
        return MicroLoss(part * scope.scale, sums)

    def end_step(self, sums: RlSums, scope: RlScope) -> StepResult:
        """The global batch's loss, its completion tokens, and the rollouts' and the loss's metrics."""
        metrics = scope.rollouts.metrics | step_metrics(sums, self.rl) | scope.seconds
        return StepResult(float(sums.loss_sum), int(scope.counts.tokens), metrics)

    def state_dict(self) -> dict[str, Any] | None:
        """The window's rollouts, for a checkpoint (num_iterations > 1: a resume inside the window continues it)."""
        if self.rl.num_iterations == 1 or self.rollouts is None:
            return None
        return {"rollouts": self.rollouts}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """The window's rollouts from a checkpoint."""
        self.rollouts = None if state is None else state["rollouts"]

    def evaluate(
        self, model: torch.nn.Module, rows: Split, indices: Sequence[int], dist: Dist, options: EvalOptions
    ) -> Metrics:
        """The eval prompts' answers scored by the reward functions (evaluation.py)."""
        runtime = self._runtime_of()
        context = evaluation.EvalContext(
            runtime.tokenizer, runtime.rewards, options, runtime.seed, runtime.eval_settings, self.rl
        )
        return {**evaluation.evaluate(model, rows, indices, dist, context), "objective": self.objective.name}

    def eval_fields(self) -> Metrics:
        """The reference model it compared with, in words (null with beta 0)."""
        return {"reference": self.objective.reference_words(self.method, self.rl)}

    def summary(self, result: Metrics) -> str:
        """The evaluation's log line."""
        return evaluation.summary(result)
