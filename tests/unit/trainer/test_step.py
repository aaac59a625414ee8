"""The optimizer step (trainer/step.py) of the preference objectives under real DeepSpeed engines, ZeRO-2 and
ZeRO-3, on 1 and 2 gloo ranks: the step's loss and every trainable parameter's full gradient (what DeepSpeed holds after
the ranks' backward passes, before the optimizer step) equal the published equations' on the whole global batch
(tests/unit/trainer/objectives/preference/test_losses.py writes them out), rtol 1e-5 in float32 (an element near zero:
1e-5 of its tensor's largest). The global batch of 4 units is dealt 2 micro-batches of 1 per rank on 2 ranks and 2 of 2
on 1 rank, so the ranks' losses, the accumulation and KTO's all-reduced reference point all take part.

Each launch runs this file as a module, one process per rank, as tests/unit/trainer/loss/chunked_zero3_ranks.py does;
the 1-rank launch is in the multirun suite (the default run's budget)."""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.trainer.loss.chunked_zero3_ranks import COLLECTIVE_TIMEOUT_S

LAUNCHER, THIS = "tests.unit.trainer.loss.chunked_zero3_ranks", "tests.unit.trainer.test_step"
CASES = [(stage, objective) for stage in (2, 3) for objective in ("dpo", "ipo", "kto", "orpo")]
UNITS = 4


# One rank (2 micro-batches of 2) in the multirun suite: the 2-rank launch, in the default run, holds the collectives
# (ZeRO-3's partitioned output layer, the all-reduced reference point) that one rank has none of.
@pytest.mark.parametrize("world", [pytest.param(1, marks=pytest.mark.multirun), 2])
def test_preference_loss_and_gradients_equal_the_published_ones_under_zero2_and_zero3(
    tmp_path: Path, world: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tests.unit.trainer.loss.chunked_zero3_ranks as launcher

    monkeypatch.setattr(launcher, "WORLD", world)
    monkeypatch.setattr(sys, "executable", sys.executable)
    results = launch(tmp_path, world)
    for result in results:
        assert result["compared"] == [f"zero{stage}-{objective}" for stage, objective in CASES]
        assert all(count > 0 for count in result["gradients"].values()), result["gradients"]


def launch(tmp_path: Path, world: int) -> list[dict]:
    """This module on `world` ranks, through chunked_zero3_ranks.py's launcher (its module name swapped)."""
    import subprocess

    import tests.unit.trainer.loss.chunked_zero3_ranks as launcher

    real = subprocess.Popen

    def popen(args: list[str], **kwargs: Any) -> Any:
        return real([arg.replace(LAUNCHER, THIS) for arg in args], **kwargs)

    launcher.subprocess.Popen = popen  # type: ignore[misc]
    try:
        return launcher.launch(tmp_path)
    finally:
        launcher.subprocess.Popen = real  # type: ignore[misc]


# ---- one rank (python -m tests.unit.trainer.test_step OUT_DIR) ----


def engine_for(stage: int, model: Any, accum: int) -> Any:
    """A DeepSpeed engine (float32) with an optimizer that leaves the weights as they are (SGD at lr 0)."""
    import deepspeed
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": accum,
        "steps_per_print": 10**6,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=params, config=config, optimizer=torch.optim.SGD(params, lr=0.0)
    )
    return engine


def compare(stage: int, name: str, dist: Any) -> int:
    """One objective on one engine against the published equations; the number of gradients compared."""
    import torch
    from deepspeed.utils import safe_get_full_grad

    from tests.unit.trainer.objectives.preference.test_losses import build, published_loss, rows_for, settings_of
    from trainer.objectives.policy import Policy
    from trainer.objectives.preference.batching import collate_preference
    from trainer.objectives.registry import build as build_objective
    from trainer.step import StepTools, optimizer_step
    from trainer.watch.faults import NO_FAULTS
    from trainer.watch.heartbeat import Heartbeat

    method = "lora"
    rows, feedback = rows_for(name)
    plain = build(method)  # the same weights as the engine's (build seeds them), never partitioned
    expected_loss = published_loss(plain, rows, feedback, name)
    plain.zero_grad()
    expected_loss.backward()
    expected = {n: p.grad for n, p in plain.named_parameters() if p.requires_grad}
    accum = UNITS // dist.world_size  # micro-batches of one unit
    engine = engine_for(stage, build(method), accum)
    mine = list(range(dist.rank * accum, (dist.rank + 1) * accum))
    batches = [
        collate_preference([rows[i]], [feedback[i]], 0, [rows[(i + 1) % UNITS]] if name == "kto" else []) for i in mine
    ]
    grads: dict[str, Any] = {}
    step = engine.step

    def capture_then_step() -> None:
        if engine.is_gradient_accumulation_boundary():
            for n, p in engine.module.named_parameters():
                if p.requires_grad:
                    grads[n] = safe_get_full_grad(p).clone()
        step()

    engine.step = capture_then_step
    objective = build_objective(settings_of(name))
    tools = StepTools(dist, Heartbeat(dist.rank), NO_FAULTS)
    stats, _ = optimizer_step(engine, Policy(engine, dist.device), batches, objective, tools, 1)
    assert stats.loss == pytest.approx(float(expected_loss.detach()), rel=1e-5), (stage, name)
    assert grads.keys() == expected.keys() and expected
    for n, grad in expected.items():
        assert float(grad.abs().max()) > 0, n
        torch.testing.assert_close(
            grads[n], grad, rtol=1e-5, atol=1e-5 * float(grad.abs().max()), msg=f"zero{stage} {name} {n}"
        )
    return len(expected)


def main(out_dir: Path) -> None:
    import deepspeed
    import torch

    from trainer.parallel.distributed import Dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    dist = Dist(rank, rank, world, rank, "localhost", torch.device("cpu"))
    result: dict[str, Any] = {"compared": [], "gradients": {}}
    for stage, objective in CASES:
        result["gradients"][f"zero{stage}-{objective}"] = compare(stage, objective, dist)
        result["compared"].append(f"zero{stage}-{objective}")
    (out_dir / f"rank-{rank}.json").write_text(json.dumps(result))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as tests/unit/trainer/loss/chunked_zero3_ranks.py: skip a teardown that may abort after the result


# ---- a mixture of experts' load balance, added once by the step for every objective ----


class Recorder:
    """An engine stand-in that keeps what the step hands to backward (the optimizer is not what is checked)."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def backward(self, loss: Any) -> None:
        self.losses.append(float(loss.detach()))
        loss.backward()

    def step(self) -> None:
        pass


def moe_step(dist: Any, coef: float | None) -> dict[str, Any]:
    """One SFT step of one micro-batch of a small Qwen3-MoE on this rank (rows differ by rank), through the step."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    from config.sections.model_train import TrainConfig
    from storage.shards import Row
    from tests.published import QWEN3_30B_A3B, QWEN3_MOE_SCALED
    from trainer.data import collate
    from trainer.loss.chunked import LossHead
    from trainer.objectives.policy import Policy
    from trainer.objectives.sft import Sft
    from trainer.parallel.moe import RouterBalance
    from trainer.step import StepTools, optimizer_step
    from trainer.watch.faults import NO_FAULTS
    from trainer.watch.heartbeat import Heartbeat

    torch.manual_seed(0)
    fields = {k: v for k, v in {**QWEN3_30B_A3B, **QWEN3_MOE_SCALED}.items() if k not in ("architectures",)}
    model = AutoModelForCausalLM.from_config(Qwen3MoeConfig(**{**fields, "vocab_size": 256}))
    router = RouterBalance.of(model.config, coef, dist)
    assert router is not None
    seen: dict[str, Any] = {"aux": []}
    observe, end_step = router.observe, router.end_step

    def observed(out: Any, mask: Any) -> Any:
        seen["aux"].append(float(observe(out, mask).detach()))
        return out.aux_loss

    def ended() -> dict[str, float]:
        seen["counts"] = router.counts.clone()  # type: ignore[union-attr]
        return end_step()

    router.observe, router.end_step = observed, ended  # type: ignore[method-assign]
    sft = Sft.of(TrainConfig())
    sft.head = LossHead.of(model, 0)
    generator = torch.Generator().manual_seed(10 + dist.rank)
    rows = [
        Row(ids, ids, [len(ids)]) for ids in (torch.randint(1, 256, (n,), generator=generator).tolist() for n in (9, 5))
    ]
    engine = Recorder()
    tools = StepTools(dist, Heartbeat(dist.rank), NO_FAULTS)
    stats, metrics = optimizer_step(engine, Policy(model, dist.device, router), [collate(rows, 0)], sft, tools, 1)
    return {
        "metrics": metrics,
        "loss": stats.loss,
        "counts": seen["counts"],
        "aux": seen["aux"],
        "backward": engine.losses,
    }


# Two launches of 2 gloo ranks (the coefficient on, then off): about a minute, so in the multirun suite.
@pytest.mark.multirun
def test_a_mixture_of_experts_adds_its_weighted_balancing_loss_and_reports_it_and_the_load_apart() -> None:
    """2 gloo ranks, each routing its own rows: the load-balancing loss, weighted by the config's
    router_aux_loss_coef (0.001), is added by the step to backward only; metrics.jsonl gets it and the load over both
    ranks."""
    from tests.gloo import on_ranks

    ranks, off = on_ranks(moe_step, 2, None), on_ranks(moe_step, 2, 0.0)
    counts = ranks[0]["counts"] + ranks[1]["counts"]  # (layers, experts), the padding of the shorter row left out
    assert counts.shape == (2, 8) and counts.sum(dim=1).tolist() == [2 * 14 * 2] * 2  # 14 real tokens, 2 experts each
    mean = counts.mean(dim=1)
    for rank, unweighted in zip(ranks, off, strict=True):
        [aux] = rank["aux"]
        # The same model and rows without the weight: the difference is the weighted balancing loss alone.
        assert rank["backward"][0] == pytest.approx(unweighted["backward"][0] + 0.001 * aux, rel=1e-6)
        assert rank["metrics"]["aux_loss"] == pytest.approx((ranks[0]["aux"][0] + ranks[1]["aux"][0]) / 2)
        assert rank["metrics"]["expert_load_max"] == pytest.approx(float((counts.max(dim=1).values / mean).max()))
        assert rank["metrics"]["experts_idle"] == float((counts == 0).sum())
        assert rank["loss"] == ranks[0]["loss"] == unweighted["loss"]  # the language model's loss alone
    assert off[0]["metrics"]["aux_loss"] > 0
