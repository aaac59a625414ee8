"""FinetuneConfig's own rules (config/schema.py), the ones that read two sections at once, through the loader as a user
meets them: the derived values (world size, node range, accumulation, global batch); launch.retries needing
train.resume=auto; a kubernetes run's storage that every pod reaches; the elastic node range (its order, the backends
that can pick nodes, the ssh hosts, the fixed global batch it needs); and what the objective implies for the data,
checked data first, then the method, then the gate. Each refusal is one line naming the keys, with exit code 2. The
batch arithmetic itself is tests/unit/config/test_batch.py; each objective's messages
tests/unit/config/test_objectives.py."""

from __future__ import annotations

import pytest

from config.loader import load_config
from core.errors import UserError

KUBERNETES = ["launch.backend=kubernetes", "launch.kubernetes.image=registry.example/tandem:1"]


def refusal(overrides: list[str]) -> str:
    """The one line a config with `overrides` is refused with (exit code 2)."""
    with pytest.raises(UserError) as info:
        load_config(None, overrides)
    message = str(info.value)
    assert "\n" not in message and info.value.exit_code == 2
    return message


def test_the_derived_values_follow_the_launch_and_train_sections() -> None:
    cfg = load_config(None, ["launch.nnodes=3", "launch.nproc_per_node=2", "train.micro_batch_size=4"])
    assert cfg.world_size == 6 and cfg.node_range == (3, 3)  # min/max_nnodes empty: every node, no fewer
    # Without train.global_batch_size the accumulation is train.gradient_accumulation_steps (2) on any world size,
    # and the global batch grows with it.
    assert [cfg.accumulation_steps(w) for w in (1, 6)] == [2, 2]
    assert [cfg.global_batch(w) for w in (1, 6)] == [8, 48]
    elastic = load_config(None, ["launch.nnodes=3", "launch.min_nnodes=2", "train.global_batch_size=24"])
    assert elastic.node_range == (2, 3) and elastic.world_size == 3
    assert [elastic.accumulation_steps(w) for w in (2, 3)] == [3, 2]
    assert {elastic.global_batch(w) for w in (2, 3)} == {24}


def test_retries_need_a_run_that_resumes() -> None:
    assert load_config(None, ["launch.retries=2", "train.resume=auto"]).launch.retries == 2
    assert load_config(None, ["launch.retries=0", "train.resume=never"]).train.resume == "never"
    message = refusal(["launch.retries=2", "train.resume=never"])
    assert "launch.retries needs train.resume=auto (a retry continues from the newest checkpoint)" in message


@pytest.mark.parametrize(
    ("storage", "pvc"),
    [("s3://bucket/tandem", None), ("/data/tandem", "shared"), ("file:///data/tandem", "shared"), ("/data", "shared")],
)
def test_kubernetes_pods_reach_an_object_store_or_the_mounted_claim(storage: str, pvc: str | None) -> None:
    claim = [f"launch.kubernetes.pvc={pvc}"] if pvc else []
    assert load_config(None, [*KUBERNETES, f"run.storage={storage}", *claim]).launch.backend == "kubernetes"


@pytest.mark.parametrize(
    ("storage", "pvc"),
    [
        ("/data/tandem", None),  # no claim: a pod's own disk
        ("/srv/tandem", "shared"),  # beside the claim's mount
        ("/database/tandem", "shared"),  # shares the prefix /data but not the folder
    ],
)
def test_kubernetes_refuses_a_path_the_pods_cannot_reach(storage: str, pvc: str | None) -> None:
    claim = [f"launch.kubernetes.pvc={pvc}"] if pvc else []
    message = refusal([*KUBERNETES, f"run.storage={storage}", *claim])
    assert f"run.storage={storage} is a path the pods cannot reach" in message
    assert "launch.kubernetes.pvc" in message and "launch.kubernetes.pvc_path (/data)" in message
    # Another backend's nodes share this machine's paths: the same storage is fine there.
    assert load_config(None, [f"run.storage={storage}"]).run.storage == storage


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["launch.nnodes=3", "launch.min_nnodes=4", "train.global_batch_size=24"],
            "launch.min_nnodes=4 <= launch.nnodes=3 <= launch.max_nnodes=3 does not hold; set them in that order",
        ),
        (
            ["launch.nnodes=3", "launch.max_nnodes=2", "train.global_batch_size=24"],
            "launch.min_nnodes=3 <= launch.nnodes=3 <= launch.max_nnodes=2 does not hold",
        ),
        (
            ["launch.backend=ssh", "launch.hosts=[n0, n1]", "launch.max_nnodes=3", "train.global_batch_size=24"],
            "launch.max_nnodes=3: the ssh backend's nodes are the 2 hosts of launch.hosts",
        ),
        (
            # Without a fixed global batch the batch would change with the nodes: today's (4 x 2 x 3 ranks) is named.
            ["launch.nnodes=3", "launch.min_nnodes=2"],
            "launch.min_nnodes/max_nnodes need train.global_batch_size (without it the batch, the schedule and the "
            "loss change with the number of nodes); set it, e.g. to today's 24",
        ),
        (
            ["launch.nnodes=3", "launch.min_nnodes=2", "train.global_batch_size=10", "train.micro_batch_size=2"],
            "train.global_batch_size=10 does not divide into train.micro_batch_size=2 x 2 ranks",
        ),
    ],
)
def test_an_elastic_range_that_cannot_hold_is_refused(overrides: list[str], expected: str) -> None:
    assert expected in refusal(overrides)


def test_the_objective_fills_in_the_data_it_trains_on() -> None:
    implied = load_config(None, ["train.objective=dpo"])
    assert implied.data.preference == "pairs"
    assert implied.model_dump(mode="json")["data"]["preference"] == "pairs"  # what spec.json records
    assert load_config(None, []).data.preference == "refuse"  # sft: supervised rows
    # An implied pairs setting refuses packing as an explicit one does.
    assert "data.packing: preference data is not packed" in refusal(["train.objective=dpo", "data.packing=true"])


def test_the_objectives_first_problem_is_named_data_then_method_then_gate() -> None:
    gate = ["register.gate.metric=perplexity", "register.gate.threshold=9"]
    everything = refusal(["train.objective=kto", "data.preference=chosen", "train.method=full", *gate])
    assert "which data.preference=chosen does not stage" in everything and "train.method" not in everything
    method = refusal(["train.objective=kto", "train.method=full", *gate])
    assert "train.objective=kto with train.method=full" in method and "register.gate" not in method
    assert "register.gate.metric=perplexity is not measured for train.objective=kto" in refusal(
        ["train.objective=kto", *gate]
    )


GRPO = ["train.objective=grpo", "train.micro_batch_size=4", "train.global_batch_size=16"]


def test_grpo_fills_in_its_prompts_their_length_and_whether_they_need_an_answer() -> None:
    """data.preference=prompts; train.rl.max_prompt_length is the data.max_length prompts are staged with (set, it wins
    over the preset's data.max_length), and a record needs its reference answer when accuracy is a reward."""
    cfg = load_config(None, [*GRPO, "train.rl.max_prompt_length=200"])
    assert (cfg.data.preference, cfg.data.max_length, cfg.train.rl.max_prompt_length) == ("prompts", 200, 200)
    assert cfg.data.require_answer is True
    other = load_config(None, [*GRPO, "data.max_length=300", "train.rl.rewards=[format]"])
    assert (other.train.rl.max_prompt_length, other.data.require_answer) == (300, False)
    assert load_config(None, [*GRPO, "data.require_answer=false"]).data.require_answer is False
    assert load_config(None, [*GRPO, "data.max_length=300", "train.rl.max_prompt_length=64"]).data.max_length == 64


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["train.micro_batch_size=2", "train.global_batch_size=12"],
            "train.objective=grpo: the global batch of 12 completions on 2 node(s) (train.micro_batch_size x "
            "accumulation x ranks) is not a multiple of train.rl.num_generations=8; set train.global_batch_size to a "
            "multiple of it",
        ),
        (["train.rl.rollout_batch_size=5"], "is not a multiple of train.rl.rollout_batch_size=5"),
        (["eval.generate.enabled=true"], "eval.generate with train.objective=grpo: its evaluation generates"),
        (["data.packing=true"], "data.packing: prompts are not packed"),
        (
            ["eval.compare_base=true", "register.gate={metric: delta.generate.rewards.format, min: 0}"],
            "register.gate.metric=delta.generate.rewards.format: format is not one of train.rl.rewards (accuracy)",
        ),
        (["register.gate={metric: perplexity, threshold: 3}"], "register.gate.metric=perplexity is not measured"),
    ],
)
def test_grpos_refusals_name_the_keys(overrides: list[str], expected: str) -> None:
    assert expected in refusal([*GRPO, *overrides])


def test_a_gate_on_a_rewards_delta_is_grpos_and_improves_upwards() -> None:
    cfg = load_config(
        None, [*GRPO, "eval.compare_base=true", "register.gate={metric: delta.generate.rewards.accuracy, min: 0}"]
    )
    assert cfg.register.gate is not None and cfg.register.gate.direction == "max"
    expected = "register.gate.metric=generate.rewards.accuracy is not measured for train.objective=sft"
    assert expected in refusal(["register.gate={metric: generate.rewards.accuracy, min: 0}"])
