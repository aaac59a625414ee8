"""Launch overhead and failure detection, measured in one session on this machine.

    .venv/bin/python -m pytest tests/benchmarks/bench_launch.py -s        (or: make bench)
    .venv/bin/python tests/benchmarks/bench_launch.py --repeats 3

(1) The pipeline's training stage (the Prefect `train` task: preflight on every node, torchrun agents,
progress watch) vs a bare `torchrun` of the same spec.json on the same nodes: median wall times and
the difference. (2) Time from a rank's death (stamped by the test fault hook as it exits) to the
training stage raising its error, with the local backend. Prints; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from core.errors import RetryableError
from launch.command import free_port, rank_environment, torchrun_command
from launch.job import TRAIN, NodePlan, trainer_args
from pipeline.plan import build_spec
from storage import layout
from storage.location import join
from storage.spec import WrittenSpec, write_spec
from tests.distributed.harness import Staged, config, stage

SETTINGS = ["launch.nnodes=2", "train.max_steps=20", "train.save_steps=20"]


def bare_torchrun(staged: Staged, name: str) -> float:
    """Wall time of two torchrun agents running the spec directly."""
    cfg = config(staged, name, SETTINGS)
    spec = build_spec(cfg, name, staged.model_path, staged.dataset)
    write_spec(spec)
    url = join(spec.run, layout.SPEC)
    port = free_port()
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            torchrun_command(NodePlan(n, 2, 1, "127.0.0.1", port), 60, "trainer", trainer_args(url, TRAIN)),
            cwd=ROOT,
            env=rank_environment(cfg.launch),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for n in range(2)
    ]
    codes = [p.wait() for p in procs]
    assert codes == [0, 0], codes
    return time.perf_counter() - started


def pipeline_stage(staged: Staged, name: str, env: dict[str, str] | None = None) -> float:
    """Wall time of the pipeline's train task (inside a flow run on Prefect's temporary server)."""
    from prefect import flow

    from tasks.train import train_on_nodes

    cfg = config(staged, name, SETTINGS)
    spec = build_spec(cfg, name, staged.model_path, staged.dataset)
    digest = write_spec(spec)
    url = join(spec.run, layout.SPEC)
    timing: dict[str, float] = {}

    @flow(name="bench-train-stage")
    def stage_flow() -> None:
        started = time.perf_counter()
        try:
            train_on_nodes(WrittenSpec(spec, url, digest))
        finally:
            timing["seconds"] = time.perf_counter() - started

    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        stage_flow()
    finally:
        os.environ.clear()
        os.environ.update(old)
    return timing["seconds"]


def detection_seconds(staged: Staged, name: str, work: Path) -> float:
    """From a rank's death (its own timestamp) to the train stage raising."""
    stamp = work / f"{name}.died"
    try:
        pipeline_stage(staged, name, {"TANDEM_TEST_EXIT_AT_STEP": "1:8", "TANDEM_TEST_EXIT_STAMP": str(stamp)})
    except RetryableError:
        return time.time() - float(stamp.read_text())
    raise AssertionError("the stage did not fail")


def run(repeats: int) -> dict[str, float]:
    """Alternate bare / pipeline runs, then the failure-detection runs; print and return the medians."""
    work = Path(tempfile.mkdtemp(prefix="tandem-bench-launch-"))
    try:
        staged = stage(work / "storage")
        bare, ours, detect = [], [], []
        for i in range(repeats):
            bare.append(bare_torchrun(staged, f"bare-{i}"))
            ours.append(pipeline_stage(staged, f"stage-{i}"))
            print(f"repeat {i + 1}: bare torchrun {bare[-1]:.1f} s, pipeline train stage {ours[-1]:.1f} s", flush=True)
        for i in range(repeats):
            detect.append(detection_seconds(staged, f"death-{i}", work))
            print(f"death {i + 1}: failure raised {detect[-1]:.1f} s after the rank died", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    b, o, d = statistics.median(bare), statistics.median(ours), statistics.median(detect)
    print(
        f"\nmedian of {repeats}: bare torchrun {b:.1f} s, pipeline train stage {o:.1f} s: "
        f"+{o - b:.1f} s ({100 * (o - b) / b:.0f}%) (goal: under 10% or under 10 s)"
    )
    print(f"median time from a rank's death to the stage's failure: {d:.1f} s (goal: under 30 s, stretch under 5 s)")
    return {"bare_torchrun_s": b, "pipeline_stage_s": o, "failure_detection_s": d}


def test_launch_overhead_and_failure_detection(prefect_server: Any) -> None:
    """On demand (not in the default run): prints the figures."""
    run(repeats=3)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """The script's entry point; returns the printed figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    return run(parser.parse_args(argv).repeats)


if __name__ == "__main__":
    main()
