"""The preference objectives (trainer/objectives/preference/) equal the published equations, written out here one pair
or one answer at a time on unpadded sequences: DPO (with label smoothing), IPO, KTO (its reference point from the
mismatched answers) and ORPO. The loss and every trainable gradient agree within rtol 1e-5 in float32 on the built-in
tiny model's shape with LoRA (its reference: the same model with the adapters disabled), and for ORPO under full
fine-tuning too; an element of a gradient near zero gets an absolute tolerance of 1e-5 of its tensor's largest element
(the padded batch sums in another order). In process; the same objectives under DeepSpeed ZeRO-2 and ZeRO-3 on 1 and 2
ranks are tests/unit/trainer/test_step.py's, through real torchrun tests/distributed/test_preference.py's."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from config.sections.model_train import TrainConfig
from storage.shards import IGNORE_INDEX, PAIR, Row
from trainer.model import tiny
from trainer.model.adapters import make_trainable
from trainer.objectives.policy import Policy
from trainer.objectives.preference.batching import collate_preference
from trainer.objectives.preference.reference import adapters_off
from trainer.objectives.preference.sums import metrics_of
from trainer.objectives.registry import build as build_objective
from trainer.parallel.distributed import Dist

VOCAB = tiny.RECIPE["vocab_size"]
BETA, SMOOTHING, W_D, W_U = 0.3, 0.1, 1.3, 0.7
KTO_SEED = 5  # rows whose mismatched log ratio is positive: KTO's reference point is not clamped to 0
ONE = Dist(rank=0, local_rank=0, world_size=1, node_rank=0, host="test", device=torch.device("cpu"))


def settings_of(name: str) -> TrainConfig:
    """train with the objective `name` and the settings the equations below use."""
    preference = {"beta": BETA, "label_smoothing": SMOOTHING if name == "dpo" else 0.0}
    preference |= {"desirable_weight": W_D, "undesirable_weight": W_U}
    return TrainConfig.model_validate({"objective": name, "preference": preference})


def rows_for(name: str) -> tuple[list[Row], list[int]]:
    """The 4 units each comparison takes: pairs, or KTO answers labelled true and false in turn."""
    return random_rows(4, pairs=name != "kto", seed=KTO_SEED if name == "kto" else 3)


def build(method: str) -> Any:
    """The tiny model made trainable as the trainer does; LoRA's B starts non-zero so the policy differs from the
    reference."""
    torch.manual_seed(5)
    model = tiny.build_model(VOCAB, pad_id=0, eos_id=1)
    model = make_trainable(model, TrainConfig.model_validate({"method": method, "lora": {"dropout": 0.0}}))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    return model.float()


def random_rows(count: int, *, pairs: bool, seed: int = 3) -> tuple[list[Row], list[int]]:
    """Preference rows of random tokens and lengths: (rows, their feedback)."""
    generator = torch.Generator().manual_seed(seed)

    def tokens(n: int) -> list[int]:
        return torch.randint(2, VOCAB, (n,), generator=generator).tolist()

    rows, feedback = [], []
    for k in range(count):
        p, c, r = (int(torch.randint(3, 12, (1,), generator=generator)) for _ in range(3))
        prompt, chosen, rejected = tokens(p), tokens(c), tokens(r) if pairs else []
        ids = prompt + chosen + rejected
        rows.append(Row(ids, [IGNORE_INDEX] * p + chosen + rejected, [p, c, len(rejected)]))
        feedback.append(PAIR if pairs else k % 2)
    return rows, feedback


# The published equations, one sequence at a time.


def logp(model: Any, prompt: list[int], answer: list[int], *, mean: bool = False) -> torch.Tensor:
    """log p(answer | prompt), summed (or averaged) over the answer's tokens, from one unpadded forward pass."""
    ids = torch.tensor([prompt + answer])
    logits = model(input_ids=ids).logits[0].float()
    steps = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    total = steps[torch.arange(len(answer)), torch.tensor(answer)].sum()
    return total / len(answer) if mean else total


def reference(model: Any, prompt: list[int], answer: list[int], *, mean: bool = False) -> torch.Tensor:
    with torch.no_grad(), adapters_off(Policy(model, ONE.device)):
        return logp(model, prompt, answer, mean=mean)


def split(row: Row) -> tuple[list[int], list[int], list[int]]:
    p, c, r = row.segments
    ids = list(row.input_ids)
    return ids[:p], ids[p : p + c], ids[p + c : p + c + r]


def published_loss(model: Any, rows: list[Row], feedback: list[int], objective: str) -> torch.Tensor:
    """The objective's loss of the batch, as its paper writes it."""
    parts = [split(row) for row in rows]
    if objective == "kto":
        n = len(parts)
        # KL reference point: each prompt with the next row's answer, mean log ratio, clamped at 0, no gradient.
        with torch.no_grad():
            kl = sum(
                logp(model, parts[i][0], parts[(i + 1) % n][1]) - reference(model, parts[i][0], parts[(i + 1) % n][1])
                for i in range(n)
            )
        z0 = max(float(kl) / n, 0.0)
        losses = []
        for (prompt, answer, _), label in zip(parts, feedback, strict=True):
            r = logp(model, prompt, answer) - reference(model, prompt, answer)
            if label == 1:
                losses.append(W_D * (1 - torch.sigmoid(BETA * (r - z0))))
            else:
                losses.append(W_U * (1 - torch.sigmoid(BETA * (z0 - r))))
        return torch.stack(losses).mean()
    if objective == "orpo":
        nll, tokens, ratio = torch.zeros(()), 0, []
        for prompt, chosen, rejected in parts:
            nll = nll - logp(model, prompt, chosen)
            tokens += len(chosen)
            pc, pr = logp(model, prompt, chosen, mean=True), logp(model, prompt, rejected, mean=True)
            odds = (pc - torch.log(1 - torch.exp(pc))) - (pr - torch.log(1 - torch.exp(pr)))
            ratio.append(-torch.log(torch.sigmoid(odds)))
        return nll / tokens + BETA * torch.stack(ratio).mean()
    mean = objective == "ipo"
    losses = []
    for prompt, chosen, rejected in parts:
        h = (logp(model, prompt, chosen, mean=mean) - logp(model, prompt, rejected, mean=mean)) - (
            reference(model, prompt, chosen, mean=mean) - reference(model, prompt, rejected, mean=mean)
        )
        if objective == "ipo":
            losses.append((h - 1 / (2 * BETA)) ** 2)
        else:
            losses.append(
                -(1 - SMOOTHING) * torch.log(torch.sigmoid(BETA * h)) - SMOOTHING * torch.log(torch.sigmoid(-BETA * h))
            )
    return torch.stack(losses).mean()


def ours(model: Any, rows: list[Row], feedback: list[int], name: str) -> tuple[torch.Tensor, dict]:
    """The trainer's loss of the same batch, as one rank's only micro-batch of a step: one padded forward pass
    (pairs: chosen and rejected together)."""
    n = len(rows)
    partners = [rows[(i + 1) % n] for i in range(n)] if name == "kto" else []
    batch = collate_preference(rows, feedback, pad_id=0, partners=partners)
    objective = build_objective(settings_of(name))
    policy = Policy(model, ONE.device)
    scope = objective.begin_step(policy, [batch], ONE)
    if name == "kto":
        assert scope.kl > 0, "the reference point would be clamped to 0: choose rows that make it positive"
    micro = objective.micro_batch(policy, batch, scope)
    return micro.backward, micro.sums


def gradients(model: Any, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize(
    ("name", "method"), [("dpo", "lora"), ("ipo", "lora"), ("kto", "lora"), ("orpo", "lora"), ("orpo", "full")]
)
def test_loss_and_gradients_equal_the_published_equations(name: str, method: str) -> None:
    model = build(method)
    rows, feedback = rows_for(name)
    theirs = published_loss(model, rows, feedback, name)
    expected = gradients(model, theirs)
    loss, _ = ours(model, rows, feedback, name)
    got = gradients(model, loss)
    assert float(theirs.detach()) > 0
    torch.testing.assert_close(loss, theirs, rtol=1e-5, atol=1e-7)
    assert got.keys() == expected.keys() and len(got) > 0
    for key in expected:
        assert float(expected[key].abs().max()) > 0, f"{key}: no gradient, the comparison would be empty"
        # Elementwise rtol 1e-5; an element near zero (a sum of terms that cancel, in another order than the padded
        # batch's) gets an absolute tolerance of 1e-5 of the tensor's largest gradient.
        scale = float(expected[key].abs().max())
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-5 * scale, msg=key)


def test_the_reference_is_the_base_and_the_rewards_start_at_zero() -> None:
    # With LoRA's B at zero (as PEFT initialises it) the policy is its reference: DPO's loss is log 2 exactly,
    # every reward 0, and no pair is counted right (the accuracy counts strictly higher chosen rewards).
    model = make_trainable(tiny.build_model(VOCAB, pad_id=0, eos_id=1), TrainConfig()).float()
    rows, feedback = random_rows(3, pairs=True)
    loss, sums = ours(model, rows, feedback, "dpo")
    assert float(loss.detach()) == pytest.approx(math.log(2), rel=1e-6)
    metrics = metrics_of(sums)
    assert metrics["reward_accuracy"] == 0.0 and metrics["reward_margin"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["chosen_logps_per_token"] < 0 and metrics["units"] == 3
