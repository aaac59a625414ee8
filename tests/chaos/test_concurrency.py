"""Concurrency: two pipelines started together with the same run.name and storage (exactly one runs, the other is
refused with one line naming the holder), and two registrations racing (two versions, none overwritten).

The pipelines are the real CLI, `python -m flows.finetune`, twice, against one Prefect server, started a random
fraction of a second apart; the registrations are separate processes released together on the S3 endpoint.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from storage.location import join
from storage.registry import read_entry, versions
from tests.conftest import ROOT
from tests.racing import race
from tests.registry_helpers import claim

REFUSAL = re.compile(
    r"^error: run (?P<name>\S+) is already running \(flow run (?P<flow>\S+) on (?P<host>\S+) pid "
    r"(?P<pid>\d+) since (?P<since>\S+)\); wait for it, cancel it, or choose another run\.name"
)


@pytest.fixture(scope="module")
def api_url(prefect_server) -> str:
    """The session's Prefect server: both pipelines report to the same one, as on a real deployment."""
    from prefect.settings import PREFECT_API_URL

    return str(PREFECT_API_URL.value())


def start_pipeline(storage: str, name: str, api_url: str) -> subprocess.Popen:
    """`python -m flows.finetune` with a short training, in the background."""
    args = [
        sys.executable,
        "-m",
        "flows.finetune",
        "--set",
        f"run.storage={storage}",
        "--set",
        f"run.name={name}",
        "--set",
        "train.max_steps=2",
        "--set",
        "train.save_steps=2",
        "--set",
        "launch.nnodes=1",
        "--set",
        "launch.rdzv_timeout=60",
    ]
    env = {**os.environ, "PREFECT_API_URL": api_url, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def visible(directory: str) -> list[str]:
    """Names in a directory, without dot files (local compare-and-swap keeps a .NAME.lock beside a document)."""
    return sorted(name for name in os.listdir(directory) if not name.startswith("."))


def test_two_pipelines_with_the_same_run_name(chaos_run, chaos_rng, chaos_record, tmp_path, api_url) -> None:
    storage, name = str(tmp_path / "storage"), f"shared-{chaos_run}"
    skew = chaos_rng.uniform(0.0, 1.0)
    started = time.monotonic()
    first = start_pipeline(storage, name, api_url)
    time.sleep(skew)
    second = start_pipeline(storage, name, api_url)
    procs, refused_after = [first, second], None
    outputs: dict[int, tuple[str, str]] = {}
    while len(outputs) < 2:
        for index, proc in enumerate(procs):
            if index not in outputs and proc.poll() is not None:
                outputs[index] = proc.communicate(timeout=60)
                if proc.returncode == 2 and refused_after is None:
                    refused_after = time.monotonic() - started - (skew if index == 1 else 0.0)
        if time.monotonic() - started > 900:
            for proc in procs:
                proc.kill()
            pytest.fail("the pipelines did not finish in 900 s")
        time.sleep(0.2)
    codes = sorted(proc.returncode for proc in procs)
    loser = next((i for i, p in enumerate(procs) if p.returncode == 2), None)
    errors = (
        [line for line in outputs[loser][1].splitlines() if line.startswith("error: ")] if loser is not None else []
    )
    lock_left = os.path.exists(os.path.join(storage, "runs", name, "LOCK"))
    chaos_record(
        "concurrency: two pipelines, same run.name",
        detect_s=refused_after,
        data_lost=False,
        skew_s=round(skew, 2),
        exit_codes=[p.returncode for p in procs],
        refusal=errors[:1],
    )
    winner = 1 - loser if loser is not None else 0
    assert codes == [0, 2], {i: (p.returncode, outputs[i][1][-2000:]) for i, p in enumerate(procs)}
    assert len(errors) == 1 and "Traceback" not in outputs[loser][0] + outputs[loser][1], outputs[loser][1][-3000:]
    match = REFUSAL.match(errors[0])
    assert match and match["name"] == name, errors[0]
    assert "registered     tandem-tiny v0001" in outputs[winner][0], outputs[winner][0][-2000:]
    assert not lock_left, "the finished pipeline left its LOCK behind"
    # The refused pipeline touched nothing: one run directory, one registry version.
    assert visible(os.path.join(storage, "runs")) == [name]
    assert visible(os.path.join(storage, "registry", "tandem-tiny")) == ["champion.json", "v0001.json"]


def test_two_registrations_race(chaos_run, chaos_rng, chaos_record, s3_endpoint, s3_bucket) -> None:
    storage = join(s3_bucket, "tandem")
    losses = [round(chaos_rng.uniform(0.5, 3.0), 3) for _ in range(2)]
    got = race(claim, [(storage, "raced", loss, f"w{i}") for i, loss in enumerate(losses)])
    whole = all(read_entry(storage, "raced", v)["writer"] == f"w{i}" for i, v in enumerate(got))
    chaos_record("concurrency: two registrations race", data_lost=not whole, versions=got)
    assert sorted(got) == [1, 2] and versions(storage, "raced") == [1, 2]
    assert whole
