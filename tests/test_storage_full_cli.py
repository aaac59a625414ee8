"""Storage full, as a user meets it through `python -m flows.finetune` with run.storage on a small tmpfs: refused
by preflight before training, in one line; and with launch.require_space=false, a checkpoint that does not fit is
one line naming the store, the file, free and needed bytes, exit 2, no traceback, the earlier checkpoint intact."""

from __future__ import annotations

import re

from storage.checkpoints import latest_complete, read_complete
from storage.layout import checkpoint_dir
from storage.location import Location
from tests.conftest import run_cli
from tests.tmpfs import NEEDS_ROOT, mounted

pytestmark = NEEDS_ROOT


def finetune(store, tiny_model: str, *overrides: str):
    sets = [f"run.storage={store}", "run.name=r", f"model.name_or_path={tiny_model}", *overrides]
    return run_cli("flows.finetune", *(arg for s in sets for arg in ("--set", s)), timeout=300)


def errors(result) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error:")]


def test_preflight_refuses_a_run_that_cannot_fit(tmp_path, tiny_model, prefect_server) -> None:
    with mounted(tmp_path / "store", "1m") as store:
        result = finetune(store, tiny_model)
        assert result.returncode == 2, result.stderr[-3000:]
        assert "Traceback" not in result.stdout + result.stderr
        (line,) = errors(result)
        assert f"not enough space on {store}: " in line
        assert "2 checkpoint(s) of 1.4 MB + export" in line and "launch.require_space=false" in line
        assert not (store / "runs" / "r" / "checkpoints").exists()


def test_a_save_that_finds_storage_full_is_one_line(tmp_path, tiny_model, prefect_server) -> None:
    with mounted(tmp_path / "store", "2m") as store:
        result = finetune(store, tiny_model, "launch.require_space=false")
        assert result.returncode == 2, result.stderr[-3000:]
        assert "Traceback" not in result.stdout + result.stderr
        (line,) = errors(result)
        # The first writer to find the store full reports it: any rank's background checkpoint writer (step 30's
        # files; the run has two nodes), or a file the step loop or the pipeline writes meanwhile (metrics.jsonl, the
        # liveness record).
        assert re.match(
            rf"error: (train failed on node \d+, rank \d+: )?storage full: {re.escape(str(store))} \(", line
        ), line
        assert f"needed) while writing {store}/runs/r/" in line
        assert "lower train.keep_latest_k" in line
        run = Location(str(store / "runs" / "r"))
        newest = latest_complete(run)
        assert newest is not None and newest.step == 15  # nothing complete was lost
        assert read_complete(checkpoint_dir(run, 30)) is None  # the save that did not fit is not a checkpoint
