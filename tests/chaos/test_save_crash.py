"""Scenario 2, a crash during a checkpoint save: a rank dies while its background writer uploads its files (one
of them on storage), after its shard is written (the others' shards and the manifest not yet), or rank 0 dies after
manifest.json and before COMPLETE — on local storage, and on S3 (a real endpoint on 127.0.0.1), where the writer's
uploads run beside the training steps. That checkpoint must never be used; the previous complete one must be there
(retention, keeping only 1, must not have deleted it for the half-saved one), and a retry resumes from it and
reproduces the uninterrupted run.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from torch.testing import assert_close

from core.errors import RetryableError
from storage import layout
from storage.checkpoints import complete_checkpoints, read_complete
from storage.fs import exists
from storage.location import Location, join
from tests.chaos.runs import run_processes
from tests.distributed.harness import Run, Staged, stage, train

SAVE_STEPS = (4, 8, 12)  # the harness saves every 4 of 12 steps
POINTS = ("mid_upload", "after_shard", "before_complete")
OVERRIDES = ["launch.nnodes=2", "train.keep_latest_k=1"]


def test_a_crash_mid_save(
    staged: Staged, chaos_reference: Run, chaos_run: int, chaos_rng, chaos_record, tmp_path
) -> None:
    point, step = chaos_rng.choice(POINTS), chaos_rng.choice(SAVE_STEPS)
    rank = 0 if point == "before_complete" else chaos_rng.randrange(2)  # only rank 0 writes COMPLETE
    name, stamp = f"save-crash-{chaos_run}", tmp_path / "died-at"
    with pytest.raises(RetryableError) as info:
        train(
            staged,
            name,
            OVERRIDES,
            env={"TANDEM_TEST_EXIT_IN_SAVE": f"{rank}:{step}:{point}", "TANDEM_TEST_EXIT_STAMP": str(stamp)},
        )
    detect_s = time.time() - float(stamp.read_text())
    assert f"train failed on node {rank}, " in str(info.value)
    assert not run_processes(name)

    run_dir = Path(staged.storage) / "runs" / name
    half = Path(str(layout.checkpoint_dir(Location(str(run_dir)), step)))
    assert (half / layout.rank_dir_name(rank)).is_dir()  # the crash really came mid-save
    assert (half / layout.MANIFEST).exists() == (point == "before_complete")
    assert not (half / layout.COMPLETE).exists() and read_complete(Location(str(half))) is None
    survivors = [c.step for c in complete_checkpoints(Location(str(run_dir)))]
    data_lost = survivors != ([step - 4] if step > 4 else [])  # keep_latest_k=1: exactly the previous one

    resumed = train(staged, name, OVERRIDES)
    log = (run_dir / "nodes" / "0" / "log.txt").read_text()
    assert f"resumed from step {step} " not in log
    if step > 4:
        assert f"resumed from step {step - 4} " in log
    assert_close(resumed.losses(), chaos_reference.losses(), rtol=1e-9, atol=1e-9)
    assert [c.step for c in complete_checkpoints(Location(str(run_dir)))] == [12]
    chaos_record(
        "kill during checkpoint save",
        detect_s=detect_s,
        data_lost=data_lost,
        rank=rank,
        step=step,
        point=point,
        survivors=survivors,
    )
    assert not data_lost, f"complete checkpoints after the crash: {survivors}"


def test_a_crash_mid_background_save_on_s3(
    s3_bucket, chaos_reference: Run, chaos_run: int, chaos_rng, chaos_record, tmp_path
) -> None:
    point, step = chaos_rng.choice(POINTS), chaos_rng.choice(SAVE_STEPS[:2])
    rank = 0 if point == "before_complete" else chaos_rng.randrange(2)
    storage = join(s3_bucket, "tandem")
    staged = stage(str(storage), options=dict(storage.options))
    name, stamp = f"s3-save-crash-{chaos_run}", tmp_path / "died-at"
    with pytest.raises(RetryableError) as info:
        train(
            staged,
            name,
            OVERRIDES,
            env={"TANDEM_TEST_EXIT_IN_SAVE": f"{rank}:{step}:{point}", "TANDEM_TEST_EXIT_STAMP": str(stamp)},
        )
    detect_s = time.time() - float(stamp.read_text())
    assert f"train failed on node {rank}, " in str(info.value)
    assert not run_processes(name)

    run_url = staged.run(name)
    half = layout.checkpoint_dir(run_url, step)
    assert exists(join(half, layout.rank_dir_name(rank)))  # some of its files reached S3: the crash came mid-save
    assert exists(join(half, layout.MANIFEST)) == (point == "before_complete")
    assert read_complete(half) is None
    survivors = [c.step for c in complete_checkpoints(run_url)]
    data_lost = survivors != ([step - 4] if step > 4 else [])

    resumed = train(staged, name, OVERRIDES)
    assert_close(resumed.losses(), chaos_reference.losses(), rtol=1e-9, atol=1e-9)
    assert [c.step for c in complete_checkpoints(run_url)] == [12]
    chaos_record(
        "kill during a background checkpoint save on S3",
        detect_s=detect_s,
        data_lost=data_lost,
        rank=rank,
        step=step,
        point=point,
        survivors=survivors,
    )
    assert not data_lost, f"complete checkpoints after the crash: {survivors}"
