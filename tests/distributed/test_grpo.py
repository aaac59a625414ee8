"""Online RL (train.objective=grpo) under real torchrun agents (marker `multirun`: several training runs each).

With the same global batch of completions, 1 rank, 2 ranks on 2 nodes and 4 ranks on 2 nodes give the same
trajectory (LoRA, ZeRO-2, beta 0.04: rollouts, rewards, KL and loss within RTOL), and so do 2 ranks under ZeRO-3
(its rollouts generated on the weights gathered whole) and full fine-tuning with its frozen reference on 2 ranks; a run
with num_iterations 2 resumed from a checkpoint inside a window, on another world size, continues it exactly (the
window's rollouts kept in the checkpoint); a reward function that raises stops the pipeline in one line naming it and
the record, with exit code 2 and nothing registered; and the CPU demo preset (`grpo-demo`: the tiny model, the digits
reward shipped with its data, 2 nodes) runs the five stages with its mean reward clearly rising (seeded), its reward
file staged and named by digest in spec.json, the registry entry and the model card."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from torch.testing import assert_close

from config.loader import load_config
from core.errors import TandemError
from storage.location import Location
from tests.distributed.harness import Run, Staged, stage, train

pytestmark = pytest.mark.multirun

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = str(ROOT / "data" / "grpo-demo" / "prompts.jsonl")
# The goal is 1e-5; measured in CI at d2f5d6b: 2 ranks against 1 differed by 1.6e-5 (KL, step 3) and ZeRO-3
# against 1 rank by 7e-5 (the loss, step 3), with the same rollouts and rewards (reduction order, amplified by Adam at
# learning rate 0.01), while other runs of the same test stayed within 1e-5. Pinned at what holds every time.
RTOL = 1e-4
# A reward every completion gets a different value of, so that every step has advantages and a gradient.
CHARS = "def chars(completions, **kwargs):\n    return [len(c[0]['content']) / 10 for c in completions]\n"
# 16 completions a step (4 prompts x 4), micro-batches of 2 on 1, 2 and 4 ranks (accumulation 8, 4, 2); 3 steps.
SETTINGS = [
    "train.objective=grpo",
    "data.max_length=96",
    "train.rl.num_generations=4",
    "train.rl.rollout_batch_size=4",
    "train.rl.max_completion_length=12",
    "train.rl.temperature=0.5",
    "train.global_batch_size=16",
    "train.micro_batch_size=2",
    "train.max_steps=3",
    "train.save_steps=3",
    "train.learning_rate=0.01",
    "train.warmup_ratio=0",
    "train.lora.dropout=0",
    "eval.generate.max_records=8",
]
COMPARED = ("loss", "reward", "kl", "entropy", "rewards/chars/mean")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Staged, list[str]]:
    root = tmp_path_factory.mktemp("grpo")
    (root / "chars.py").write_text(CHARS)
    settings = [*SETTINGS, f"data.source={PROMPTS}", f"train.rl.rewards=[accuracy, {root / 'chars.py'}:chars]"]
    return stage(root, overrides=settings), settings


def figures(run: Run) -> dict[str, list[float]]:
    steps = [r for r in run.metrics() if "event" not in r]
    return {key: [r[key] for r in steps] for key in COMPARED if key in steps[0]}


def same(run: Run, reference: Run) -> None:
    ours, theirs = figures(run), figures(reference)
    assert ours.keys() == theirs.keys() and len(theirs["loss"]) == 3
    for key in theirs:
        assert_close(ours[key], theirs[key], rtol=RTOL, atol=1e-7, msg=key)


@pytest.fixture(scope="module")
def one_rank(prompts: tuple[Staged, list[str]]) -> Run:
    staged, settings = prompts
    return train(staged, "grpo-1", [*settings, "train.rl.beta=0.04", "launch.nnodes=1"])


def test_one_two_and_four_ranks_on_two_nodes_give_the_same_trajectory(
    prompts: tuple[Staged, list[str]], one_rank: Run
) -> None:
    staged, settings = prompts
    kl = [*settings, "train.rl.beta=0.04"]
    two = train(staged, "grpo-2", [*kl, "launch.nnodes=2"])
    four = train(staged, "grpo-4", [*kl, "launch.nnodes=2", "launch.nproc_per_node=2"])
    assert figures(one_rank)["kl"][-1] > 0 and figures(one_rank)["loss"] != [0.0, 0.0, 0.0]
    same(two, one_rank)
    same(four, one_rank)


def test_zero3_generates_on_the_gathered_weights_and_gives_the_same_trajectory(
    prompts: tuple[Staged, list[str]], one_rank: Run
) -> None:
    staged, settings = prompts
    zero3 = train(staged, "grpo-z3", [*settings, "train.rl.beta=0.04", "deepspeed.config=config/deepspeed/zero3.json"])
    same(zero3, one_rank)


def test_full_fine_tuning_takes_a_frozen_reference_on_one_and_two_ranks(prompts: tuple[Staged, list[str]]) -> None:
    staged, settings = prompts
    full = [*settings, "train.method=full", "train.rl.beta=0.04", "train.learning_rate=0.0005"]
    one, two = (train(staged, f"grpo-full-{n}", [*full, f"launch.nnodes={n}"]) for n in (1, 2))
    same(two, one)
    kl = figures(one)["kl"]
    assert abs(kl[0]) < 1e-6 < kl[-1]  # the policy starts as its reference, then leaves it


def test_a_run_resumed_inside_a_window_continues_it_on_another_world_size(prompts: tuple[Staged, list[str]]) -> None:
    staged, settings = prompts
    window = [*settings, "train.rl.num_iterations=2", "train.rl.beta=0.04", "train.max_steps=5", "train.save_steps=3"]
    whole = train(staged, "grpo-window", [*window, "launch.nnodes=2"])
    target = Path(str(staged.storage)) / "runs" / "grpo-window-resumed" / "checkpoints" / whole.checkpoint(3).name
    shutil.copytree(whole.checkpoint(3), target)
    resumed = train(staged, "grpo-window-resumed", [*window, "launch.nnodes=1"])
    steps = [r for r in resumed.metrics() if "event" not in r]
    # Step 4 reuses step 3's rollouts (from the checkpoint); step 5 generates the next window's, seeded as before.
    assert [r["step"] for r in steps] == [4, 5] and steps[0]["generation_s"] == 0.0 < steps[1]["generation_s"]
    uninterrupted = [r for r in whole.metrics() if "event" not in r][-2:]
    for ours, theirs in zip(steps, uninterrupted, strict=True):
        for key in ("loss", "kl", "reward", "entropy", "completions/mean_length"):
            assert_close(ours[key], theirs[key], rtol=RTOL, atol=1e-7, msg=key)


def test_a_reward_that_raises_stops_the_pipeline_in_one_line_and_registers_nothing(
    prefect_server: object, tmp_path: Path
) -> None:
    from flows.finetune import finetune

    (tmp_path / "broken.py").write_text("def broken(completions, **kwargs):\n    raise KeyError('answer')\n")
    cfg = load_config(
        "grpo-demo",
        [f"run.storage={tmp_path}", "run.name=broken", f"train.rl.rewards=[{tmp_path / 'broken.py'}:broken]",
         "register.gate=null", "eval.compare_base=false"],
    )  # fmt: skip
    with pytest.raises(TandemError) as caught:
        finetune(cfg)
    message = str(caught.value)
    assert f"reward {tmp_path / 'broken.py'}:broken raised KeyError ('answer') scoring the completions of " in message
    assert f"{ROOT / 'data' / 'grpo-demo' / 'prompts.jsonl'}:" in message and caught.value.exit_code == 2
    assert not (tmp_path / "registry").exists()


@pytest.mark.parametrize("seed", [1])
def test_the_cpu_demo_preset_raises_its_mean_reward(prefect_server: object, tmp_path: Path, seed: int) -> None:
    from flows.finetune import finetune
    from storage.metrics import read_metrics

    cfg = load_config("grpo-demo", [f"run.storage={tmp_path}", f"run.name=demo-{seed}", f"train.seed={seed}"])
    summary = finetune(cfg)
    steps = [r for r in read_metrics(Location(summary["run_url"])) if "event" not in r]
    rewards = [r["reward"] for r in steps]
    assert len(steps) == cfg.train.max_steps
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.3, rewards
    assert summary["registered"] and summary["eval"]["reward"] > 0.3, summary
    spec = json.loads((Path(summary["run_url"]) / "spec.json").read_text())
    staged = spec["rewards"][1]
    assert staged["name"].endswith("data/grpo-demo/reward.py:digits") and len(staged["digest"]) == 64
    assert Path(staged["url"]).read_bytes() == (ROOT / "data" / "grpo-demo" / "reward.py").read_bytes()
    entry = json.loads(Path(summary["registry_url"]).read_text())
    assert f"(sha256 {staged['digest'][:16]})" in entry["lineage"]["rewards"][1]
    card = (Path(summary["run_url"]) / "model_card.md").read_text()
    assert f"1 x `{staged['name']} (sha256 {staged['digest'][:16]})`" in card and "## Training" in card
    assert "| reward `digits` (train.rl.rewards), mean |" in card
