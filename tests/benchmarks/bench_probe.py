"""What the network probe costs at start-up, measured in one session on this machine.

    .venv/bin/python -m pytest tests/benchmarks/bench_probe.py -s        (or: make bench)
    .venv/bin/python tests/benchmarks/bench_probe.py --repeats 5

Training launches of the same tiny job (local backend, 2 nodes x 1 rank, 4 steps) alternate between
launch.probe_mb=0 (the baseline: no probe) and the default launch.probe_mb; printed: the medians of both wall times,
their ratio, and the median of the probe's own time as rank 0 records it in preflight.json (`seconds`). The
bandwidth figures across real interfaces (an unshaped veth, a tbf-shaped one) are printed by the netns suite.
Asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from config.sections.launch import LaunchConfig
from launch.job import TRAIN
from launch.phase import run_phase
from pipeline.plan import build_spec
from storage import layout
from storage.location import join
from storage.spec import WrittenSpec, write_spec
from tests.distributed.harness import Staged, config, stage

SETTINGS = ["launch.nnodes=2", "train.max_steps=4", "train.save_steps=4"]


def launch(staged: Staged, name: str, probe_mb: float) -> tuple[float, float | None]:
    """(wall seconds of one training launch, the probe's own seconds from preflight.json or None)."""
    cfg = config(staged, name, [*SETTINGS, f"launch.probe_mb={probe_mb}"])
    spec = build_spec(cfg, name, staged.model_path, staged.dataset)
    written = WrittenSpec(spec, join(spec.run, layout.SPEC), write_spec(spec))
    started = time.perf_counter()
    run_phase(written, TRAIN, lambda _: None)
    wall = time.perf_counter() - started
    report = json.loads((staged.storage / "runs" / name / "nodes" / "0" / layout.PREFLIGHT).read_text())
    probe = report["checks"].get("bandwidth")
    return wall, (probe["seconds"] if probe else None)


def run(repeats: int) -> dict[str, float]:
    """Alternate launches without and with the probe; print and return the medians and the ratio."""
    default_mb = LaunchConfig.model_fields["probe_mb"].default
    work = Path(tempfile.mkdtemp(prefix="tandem-bench-probe-"))
    try:
        staged = stage(work / "storage")
        launch(staged, "warm-up", 0)  # the first launch pays for compiled extensions and page cache
        without, with_probe, probe_s = [], [], []
        for i in range(repeats):
            without.append(launch(staged, f"no-probe-{i}", 0)[0])
            wall, seconds = launch(staged, f"probe-{i}", default_mb)
            with_probe.append(wall)
            probe_s.append(seconds)
            print(
                f"repeat {i + 1}: no probe {without[-1]:.2f} s, probe {with_probe[-1]:.2f} s "
                f"(the probe itself {seconds:.3f} s)",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    a, b, probe = statistics.median(without), statistics.median(with_probe), statistics.median(probe_s)
    print(
        f"\nmedian of {repeats}: launch without the probe {a:.2f} s, with launch.probe_mb={default_mb} {b:.2f} s: "
        f"ratio {b / a:.3f} ({b - a:+.2f} s); the probe's own time (rank 0) {probe:.3f} s"
    )
    return {"without_probe_s": a, "with_probe_s": b, "ratio": b / a, "probe_s": probe}


def test_probe_cost() -> None:
    """On demand (not in the default run): prints the figures."""
    run(repeats=3)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """The script's entry point; returns the printed figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    return run(parser.parse_args(argv).repeats)


if __name__ == "__main__":
    main()
