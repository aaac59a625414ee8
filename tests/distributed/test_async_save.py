"""Background saves under real torchrun agents: training goes on while a checkpoint is written, the checkpoint
becomes COMPLETE only once every rank's files are on storage, and the digests its writers computed while writing are
those of the files on storage."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from torch.testing import assert_close

from core.errors import TandemError
from storage import layout
from storage.checkpoints import complete_checkpoints
from storage.location import Location
from storage.manifest import verify_files
from tests.distributed.harness import Run, Staged, train


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def test_training_goes_on_while_a_save_is_written(staged: Staged, reference: Run, tmp_path: Path) -> None:
    """Every writer holds its save of step 4 until the test releases it: steps 5 to 8 run meanwhile, the next save
    (step 8) waits for it, and nothing is COMPLETE before the release."""
    name, release = "async-held", tmp_path / "release"
    run_dir = Path(staged.storage) / "runs" / name
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            # the reference's training settings (eval settings never change the trajectory)
            outcome["run"] = train(
                staged,
                name,
                ["launch.nnodes=2", "train.keep_latest_k=2"],
                env={"TANDEM_TEST_HOLD_SAVE": str(release)},
            )
        except BaseException as exc:  # noqa: BLE001 - raised below, in the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 600
    while thread.is_alive() and time.monotonic() < deadline:
        if any(r.get("step") == 8 and "loss" in r for r in metrics(run_dir)):
            break
        time.sleep(0.2)
    rows = metrics(run_dir)
    try:
        assert [r["step"] for r in rows if "loss" in r] == list(range(1, 9)), rows
        assert not [r for r in rows if r.get("event") == "checkpoint"]  # step 4's save is still being written
        assert not (Path(str(layout.checkpoint_dir(Location(str(run_dir)), 4))) / layout.COMPLETE).exists()
    finally:
        release.touch()
        thread.join(600)
    if "error" in outcome:
        raise outcome["error"]
    saved = [r for r in metrics(run_dir) if r.get("event") == "checkpoint"]
    assert [r["step"] for r in saved] == [4, 8, 12]
    assert all(0 < r["blocked_s"] < r["seconds"] and r["bytes"] > 0 for r in saved)
    kept = complete_checkpoints(Location(str(run_dir)))
    assert [c.step for c in kept] == [12, 8]  # keep_latest_k=2, applied after each COMPLETE
    for ckpt in kept:
        verify_files(ckpt.url, ckpt.manifest, mode="full")  # the digests written while writing are the files'
    assert_close(outcome["run"].losses(), reference.losses(), rtol=1e-9, atol=1e-9)


def test_a_writer_error_stops_the_run_in_one_line_and_keeps_the_last_checkpoint(staged: Staged) -> None:
    """The run's checkpoints directory fills up while a background writer writes step 8 (a real tmpfs mounted
    there, 12 MB: one checkpoint of full fine-tuning of the tiny model under ZeRO-3 is about 8 MB): the rank's main
    thread raises the writer's error at its next step boundary, the job stops with the one line of a full store
    (storage/fs.py StorageFull: the mount, the file, what to free) naming the rank, step 4 stays complete and step 8
    has no COMPLETE. Needs root (mount), as CI runs."""
    run_dir = Path(staged.storage) / "runs" / "disk-full"
    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(checkpoints)], check=True)
    try:
        with pytest.raises(TandemError) as info:
            train(
                staged,
                "disk-full",
                [
                    "launch.nnodes=2",
                    "train.method=full",
                    "train.keep_latest_k=1",
                    "deepspeed.config=config/deepspeed/zero3.json",
                ],
            )
        line = str(info.value)
        assert "\n" not in line and re.match(r"train failed on node \d, rank \d: ", line), line
        assert f"storage full: {checkpoints} (" in line and "/step-00000008/" in line, line  # issue 33's line
        assert [c.step for c in complete_checkpoints(Location(str(run_dir)))] == [4]
        assert not (Path(str(layout.checkpoint_dir(Location(str(run_dir)), 8))) / layout.COMPLETE).exists()
    finally:
        subprocess.run(["umount", "-l", str(checkpoints)], check=False)
