"""The reliability suite's plumbing: each scenario runs TANDEM_CHAOS_RUNS times (default 5) with a fault at a
random moment, and every run appends one result row that `python -m tests.chaos.summary` turns into the table.

    pytest -m chaos                              # all scenarios, 5 runs each
    TANDEM_CHAOS_RUNS=2 pytest -m chaos -k node  # fewer runs, one scenario
    TANDEM_CHAOS_SEED=1234 pytest -m chaos       # replay the same random fault points

A scenario test takes the `chaos_run` fixture (the run index; the test is parametrized over it), draws its fault
point from `chaos_rng`, and reports through `chaos_record`. The row's `passed` comes from the test's own outcome,
so a failed assertion is counted as a failed run, not a missing one.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

RUNS = int(os.environ.get("TANDEM_CHAOS_RUNS", "5"))
# One seed per session, printed and stored in every row, so a failing run can be replayed exactly.
SEED = int(os.environ.get("TANDEM_CHAOS_SEED") or random.SystemRandom().randrange(1 << 30))
RESULTS = Path(os.environ.get("TANDEM_CHAOS_RESULTS", ROOT / ".tandem" / "chaos" / "results.jsonl"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/chaos is in the chaos suite, which the default run leaves out."""
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.chaos)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "chaos_run" in metafunc.fixturenames:
        metafunc.parametrize("chaos_run", range(RUNS), ids=[f"run{i}" for i in range(RUNS)])


def pytest_report_header() -> str:
    return f"chaos: {RUNS} run(s) per scenario, seed {SEED} (TANDEM_CHAOS_SEED), results in {RESULTS}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.chaos_call_report = report  # type: ignore[attr-defined]


@pytest.fixture
def chaos_rng(request: pytest.FixtureRequest) -> random.Random:
    """A generator seeded from the session seed, the test and the run index: random, yet replayable."""
    return random.Random(f"{SEED}:{request.node.nodeid}")


class Recorder:
    """Collects one scenario run's measurements; the fixture writes them when the test ends."""

    def __init__(self) -> None:
        self.scenario: str | None = None
        self.detect_s: float | None = None
        self.data_lost: bool | None = None
        self.detail: dict = {}

    def __call__(
        self, scenario: str, *, detect_s: float | None = None, data_lost: bool = False, **detail: object
    ) -> None:
        """scenario: the table's row name; detect_s: fault to detection, when the scenario has one;
        data_lost: True when anything complete was lost or a half-written object sits under a final name."""
        self.scenario, self.detect_s, self.data_lost, self.detail = scenario, detect_s, data_lost, detail


@pytest.fixture
def chaos_record(request: pytest.FixtureRequest) -> Iterator[Callable[..., None]]:
    recorder = Recorder()
    started = time.time()
    yield recorder
    report = getattr(request.node, "chaos_call_report", None)
    if recorder.scenario is None:
        # A run that failed before recording still counts, under the test's own name.
        recorder.scenario = request.node.originalname
    row = {
        "scenario": recorder.scenario,
        "test": request.node.nodeid,
        "seed": SEED,
        "passed": bool(report and report.passed),
        "detect_s": recorder.detect_s,
        "data_lost": recorder.data_lost,
        "duration_s": round(time.time() - started, 2),
        "at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()),
        **recorder.detail,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a") as handle:
        handle.write(json.dumps(row, default=str) + "\n")


@pytest.fixture(scope="session")
def chaos_reference(staged):
    """One uninterrupted 2-node run per session (the harness's 12 steps, a checkpoint every 4): the
    trajectory every interrupted-and-resumed run must reproduce exactly."""
    from tests.distributed.harness import train

    return train(staged, "chaos-reference", ["launch.nnodes=2"])
