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
    from trainer.objectives.preference.batching import collate_preference
    from trainer.objectives.registry import build as build_objective
    from trainer.step import optimizer_step
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
    stats, _ = optimizer_step(engine, batches, dist, Heartbeat(dist.rank), 1, objective)
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
