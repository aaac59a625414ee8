"""The global batch as the invariant and resume on another world size, under real torchrun agents (marker `elastic`,
run by `make test-suites`).

Every run here has the same global batch (12 rows: micro-batches of 2, accumulation derived per world size) and
LoRA dropout 0, so the trajectory is a function of the seed, the step and the global batch alone: 1, 2 and 3 ranks
give the same losses, and a checkpoint written by N ranks resumes on M ranks onto the uninterrupted trajectory.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import threading
from pathlib import Path

import pytest
from torch.testing import assert_close

from core.errors import RetryableError, UserError
from storage.checkpoints import latest_complete, read_complete, read_universal
from storage.location import Location
from storage.metrics import read_metrics
from tests.chaos.runs import run_processes, steps_logged, wait_for
from tests.distributed.harness import ELASTIC, Run, Staged, lost_node_pipeline, train
from tests.qwen_configs import QWEN_ZERO2, QWEN_ZERO3

pytestmark = pytest.mark.elastic

RTOL = 1e-5


def deepspeed_json(tmp_path_factory: pytest.TempPathFactory, content: dict) -> str:
    path = tmp_path_factory.mktemp("ds") / "ds_config.json"
    path.write_text(json.dumps(content))
    return str(path)


def resume_elsewhere(staged: Staged, source: Run, name: str, overrides: list[str]) -> Run:
    """A new run that starts from `source`'s step-8 checkpoint (copied in, as a retry finds it) with `overrides`."""
    target = Path(staged.storage) / "runs" / name / "checkpoints" / source.checkpoint(8).name
    shutil.copytree(source.checkpoint(8), target)
    return train(staged, name, [*ELASTIC, *overrides])


@pytest.fixture(scope="module")
def two_ranks(staged: Staged) -> Run:
    """The uninterrupted run every trajectory here is compared with: 2 nodes x 1 rank, ZeRO-2 + LoRA."""
    return train(staged, "elastic-2", [*ELASTIC, "launch.nnodes=2"])


@pytest.fixture(scope="module")
def three_ranks(staged: Staged) -> Run:
    """The same optimisation on 3 nodes x 1 rank."""
    return train(staged, "elastic-3", [*ELASTIC, "launch.nnodes=3"])


def test_one_two_and_three_ranks_give_the_same_trajectory(staged: Staged, two_ranks: Run, three_ranks: Run) -> None:
    one = train(staged, "elastic-1", [*ELASTIC, "launch.nnodes=1"])
    assert len(two_ranks.losses()) == 16
    assert_close(one.losses(), two_ranks.losses(), rtol=RTOL, atol=0)
    assert_close(three_ranks.losses(), two_ranks.losses(), rtol=RTOL, atol=0)
    assert [r["lr"] for r in one.metrics() if "event" not in r] == [
        r["lr"] for r in two_ranks.metrics() if "event" not in r
    ]


def test_two_ranks_resume_on_three_and_three_on_two(staged: Staged, two_ranks: Run, three_ranks: Run) -> None:
    """8 steps on 2 ranks, then to 16 on 3 (as 1 node x 3 ranks), and 3 -> 2: each continues the uninterrupted
    trajectory; the universal form is written beside the checkpoint, complete, and reused by the next resume."""
    up = resume_elsewhere(staged, two_ranks, "elastic-2to3", ["launch.nnodes=1", "launch.nproc_per_node=3"])
    assert_close(up.losses(), two_ranks.losses()[8:], rtol=RTOL, atol=0)
    log = (up.run_dir / "nodes" / "0" / "log.txt").read_text()
    assert "converted checkpoint step 8 from 2 ranks to the universal form" in log
    assert "resumed from step 8 written by 2 ranks, now on 3" in log
    source = read_complete(Location(str(up.checkpoint(8))))
    universal = read_universal(source)
    assert universal is not None and universal.manifest["source_world_size"] == 2
    assert json.loads((up.checkpoint(16) / "manifest.json").read_text())["world_size"] == 3

    down = resume_elsewhere(staged, three_ranks, "elastic-3to2", ["launch.nnodes=2"])
    assert_close(down.losses(), two_ranks.losses()[8:], rtol=RTOL, atol=0)

    # A later resume of the same checkpoint on another world size reuses the converted form (in this process, on
    # one rank without a process group: what every rank of such a resume runs first).
    import torch

    from trainer.checkpointing.reshard import universal_form
    from trainer.parallel.distributed import Dist

    marker = up.checkpoint(8) / "universal" / "COMPLETE"
    written_at = marker.stat().st_mtime_ns
    reused = universal_form(source, Dist(0, 0, 1, 0, "test", torch.device("cpu")), "blake3")
    assert reused.manifest_digest == universal.manifest_digest and marker.stat().st_mtime_ns == written_at


@pytest.mark.parametrize("stage,method", [(3, "lora"), (2, "full"), (3, "full")])
def test_resharding_across_stages_and_methods(staged: Staged, tmp_path_factory, stage: int, method: str) -> None:
    """ZeRO-3 partitions the parameters themselves and full fine-tuning carries the whole model's Adam state: 8 steps
    on 2 ranks resumed on 3 equal 16 uninterrupted steps on 2."""
    ds = deepspeed_json(tmp_path_factory, QWEN_ZERO3 if stage == 3 else QWEN_ZERO2)
    common = [f"deepspeed.config={ds}", f"train.method={method}", "train.learning_rate=0.0003"]
    whole = train(staged, f"elastic-z{stage}-{method}", [*ELASTIC, *common, "launch.nnodes=2"])
    resumed = resume_elsewhere(staged, whole, f"elastic-z{stage}-{method}-to3", [*common, "launch.nnodes=3"])
    assert_close(resumed.losses(), whole.losses()[8:], rtol=RTOL, atol=0)


def test_another_method_and_stage_are_still_refused(staged: Staged, two_ranks: Run, tmp_path_factory) -> None:
    """A ZeRO-2 LoRA checkpoint asked to resume a ZeRO-3 full fine-tune on 3 ranks: the world size would be
    converted, the stage and the method cannot; the run stops before loading, naming both (the message itself is
    unit-tested in tests/unit/launch/test_elastic.py)."""
    ds = deepspeed_json(tmp_path_factory, QWEN_ZERO3)
    with pytest.raises(UserError) as info:
        train(
            staged,
            "elastic-other-layout",
            [
                *ELASTIC,
                "launch.nnodes=3",
                "train.method=full",
                f"deepspeed.config={ds}",
                f"train.resume={two_ranks.checkpoint(8)}",
            ],
        )
    assert "its ZeRO stage 2 (this run: 3) and train.method lora (this run: full) differ" in str(info.value)
    assert not (two_ranks.checkpoint(8) / "universal").exists()


def test_a_node_lost_for_good_the_run_completes_on_the_survivors(
    prefect_server, staged: Staged, two_ranks: Run, tmp_path: Path
) -> None:
    """3 nodes, node 2 lost for good at a random step: the retry finds it failing preflight and continues on 2
    nodes from the newest complete checkpoint, onto the uninterrupted trajectory; the spec.json of the attempt, the
    registry lineage and the model card record both attempts."""
    died_at = random.Random().randint(2, 15)
    summary, run_dir, resume_s = lost_node_pipeline(staged, "elastic-lost-node", died_at, tmp_path)
    print(f"node 2 lost at step {died_at}: training resumed on the survivors {resume_s:.1f} s later")
    losses = [r["loss"] for r in read_metrics(Location(str(run_dir))) if "event" not in r]
    assert_close(losses, two_ranks.losses(), rtol=RTOL, atol=0)

    spec = json.loads((run_dir / "spec.json").read_text())
    first, second = spec["attempts"]
    assert (first["nodes"], first["world_size"], first["from_step"]) == ([0, 1, 2], 3, 0)
    assert (second["nodes"], second["world_size"], second["from_step"]) == ([0, 1], 2, 8 if died_at > 8 else 0)
    assert second["left_out"] == {"2": "node 2: unreachable (lost)"}
    assert spec["world_size"] == 2 and spec["config"]["launch"]["nnodes"] == 2
    entry = json.loads(Path(summary["registry_url"]).read_text())
    assert entry["lineage"]["attempts"] == spec["attempts"] and entry["lineage"]["world_size"] == 2
    card = (run_dir / "model_card.md").read_text()
    assert "attempt 2: nodes 0,1 (2 ranks) from step" in card and "node 2 left out: node 2: unreachable" in card


def test_a_sigterm_to_one_nodes_agent_saves_an_emergency_checkpoint_and_the_retry_resumes(
    staged: Staged, two_ranks: Run
) -> None:
    """A spot machine's notice: a real SIGTERM to node 1's torchrun agent mid-run. Every rank stops at the next step
    boundary with an emergency checkpoint of that step, the job ends retryable, and the retry resumes from it onto the
    uninterrupted trajectory. train.save_every_minutes (0.6 s here) also saved between the step checkpoints."""
    name, run_dir = "elastic-preempted", Path(staged.storage) / "runs" / "elastic-preempted"
    overrides = [*ELASTIC, "launch.nnodes=2", "train.preempt_grace_s=25", "train.save_every_minutes=0.01"]
    failure: list[BaseException] = []

    def first_attempt() -> None:
        try:  # a slow rank 0 (0.05 s a micro-batch) leaves time to aim at a step; it changes no number
            train(staged, name, overrides, env={"TANDEM_TEST_SLOW_RANK": "0:0.05"})
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            failure.append(exc)

    worker = threading.Thread(target=first_attempt)
    worker.start()
    after = random.Random().randint(5, 11)
    wait_for(lambda: max(steps_logged(run_dir), default=0) >= after or not worker.is_alive(), 180, f"step {after}")
    agents = [pid for pid, cmd in run_processes(name) if "torch.distributed.run" in cmd and "--node-rank=1" in cmd]
    assert len(agents) == 1, "node 1's agent not found (training already over?)"
    os.kill(agents[0], signal.SIGTERM)  # the agent alone: torchrun forwards it to its ranks
    worker.join(120)
    assert failure and isinstance(failure[0], RetryableError), failure

    stopped = max(steps_logged(run_dir))
    assert stopped < 16 and latest_complete(Location(str(run_dir))).step == stopped
    saved = {r["step"]: r for r in json_lines(run_dir / "metrics.jsonl") if r.get("event") == "checkpoint"}
    assert stopped in saved  # the emergency save ("reason": "sigterm"), or the clock's when it had just saved
    clock = [step for step, r in saved.items() if step % 8 and "reason" not in r]
    assert clock, saved  # train.save_every_minutes saved between train.save_steps
    assert "emergency checkpoint complete" in (run_dir / "nodes" / "1" / "log.txt").read_text()

    resumed = train(staged, name, overrides)
    assert f"resumed from step {stopped} " in (run_dir / "nodes" / "0" / "log.txt").read_text()
    assert_close(resumed.losses(), two_ranks.losses(), rtol=RTOL, atol=0)


def json_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
