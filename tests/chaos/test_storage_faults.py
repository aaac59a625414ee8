"""Storage faults: the S3 endpoint (moto's server on 127.0.0.1) stops in the middle of a real training run (2 nodes,
torchrun, DeepSpeed on gloo, checkpoints and metrics on S3), for a few seconds or for good.

A short outage is retried with backoff and the run completes; a permanent one fails the run with one line that
names the endpoint. Either way, listing the bucket afterwards finds no object under a final name without its
completion: every COMPLETE matches its manifest and every file in it, every dataset manifest its files, every
registry entry is whole.
"""

from __future__ import annotations

import json
import logging
import re
import time

import pytest

from core.errors import TandemError
from storage import layout
from storage.digest import digest_bytes
from storage.fs import filesystem, read_bytes
from storage.location import Location, join
from storage.manifest import verify_files
from storage.registry import read_entry, register_version, versions
from storage.retry import RETRY_ENV
from tests.distributed.harness import stage, train
from tests.registry_helpers import entry

STEPS = 12  # the harness's train.max_steps; checkpoints every 4
RETRY_LINE = re.compile(r"storage: ([a-z ]+?) (s3://\S+) failed")


def retried(text: str, run_url: str) -> set[str]:
    """The storage operations that were retried, from log text: {"upload checkpoints/step-00000008/...", ...}."""
    return {f"{op} {url.replace(run_url + '/', '')}" for op, url in RETRY_LINE.findall(text)}


def audit(storage: Location) -> dict[str, list[str]]:
    """What the bucket holds under final names: {"complete": [...], "incomplete": [...], "broken": [...]}.

    complete: directories whose marker (COMPLETE or the dataset manifest) checks out against every file;
    incomplete: checkpoint or dataset directories without their marker (invisible to readers);
    broken: a marker that does not match its files, or a registry entry that is not whole.
    """
    fs, root = filesystem(storage)
    fs.invalidate_cache()
    paths = sorted(fs.find(root))
    out: dict[str, list[str]] = {"complete": [], "incomplete": [], "broken": []}
    dirs = {p.rsplit("/", 1)[0] for p in paths}
    for directory in sorted(dirs):
        url = storage.with_url(f"s3://{directory}")
        name = directory.rsplit("/", 1)[1]
        parent = directory.rsplit("/", 2)[1]
        if name.startswith("step-") or name == "final":
            if f"{directory}/{layout.COMPLETE}" not in paths:
                out["incomplete"].append(str(url))
                continue
            raw = read_bytes(join(url, layout.MANIFEST))
            manifest = json.loads(raw)
            marker = read_bytes(join(url, layout.COMPLETE)).decode().strip()
            try:
                assert marker == digest_bytes(raw, manifest["digest_algorithm"]), "COMPLETE != manifest digest"
                verify_files(url, manifest, mode="full")
                out["complete"].append(str(url))
            except (AssertionError, TandemError) as exc:
                out["broken"].append(f"{url}: {exc}")
        elif parent == "datasets" and name != "by-source":
            if f"{directory}/{layout.MANIFEST}" not in paths:
                out["incomplete"].append(str(url))
                continue
            try:
                verify_files(url, json.loads(read_bytes(join(url, layout.MANIFEST))), mode="full")
                out["complete"].append(str(url))
            except TandemError as exc:
                out["broken"].append(f"{url}: {exc}")
    for path in paths:
        if "/registry/" in path and path.endswith(".json"):
            doc = json.loads(read_bytes(storage.with_url(f"s3://{path}")))
            if doc.get("schema") not in (layout.REGISTRY_SCHEMA, layout.CHAMPION_SCHEMA):
                out["broken"].append(f"s3://{path}: not a whole registry document")
    return out


def _reached(metrics_url: Location, step: int, delay_s: float) -> bool:
    """True `delay_s` seconds after metrics.jsonl first shows `step` (read directly, with no retries of ours)."""
    fs, path = filesystem(metrics_url)
    fs.invalidate_cache(path)
    lines = fs.cat_file(path).decode().splitlines()
    if not any(json.loads(line).get("step", 0) >= step for line in lines if line.strip()):
        return False
    time.sleep(delay_s)
    return True


def test_s3_down_a_few_seconds_mid_run(chaos_run, chaos_rng, chaos_record, s3_stoppable, monkeypatch, caplog) -> None:
    endpoint, bucket = s3_stoppable
    storage = join(bucket, "tandem")
    staged = stage(str(storage), options=dict(storage.options))
    monkeypatch.setenv(RETRY_ENV, "60")
    # The fault point is a random training step (between its metrics line and the next one: saves, metrics,
    # the supervisor's reads), plus a random fraction of a second.
    at_step, after, length = chaos_rng.randint(1, STEPS - 1), chaos_rng.uniform(0.0, 1.0), chaos_rng.uniform(2.0, 8.0)
    name = f"outage-{chaos_run}"
    metrics = join(storage, f"runs/{name}/{layout.METRICS}")
    outage = endpoint.outage(0.0, length, when=lambda: _reached(metrics, at_step, after))
    with caplog.at_level(logging.WARNING, logger="storage.retry"):
        run = train(staged, name, ["launch.nnodes=2"])
    ended = time.monotonic()
    outage.join()
    hit = outage.stopped_at is not None and outage.stopped_at < ended  # type: ignore[attr-defined]

    # A registration while the endpoint is down again: retried, and exactly one version.
    registry_outage = endpoint.outage(0.0, chaos_rng.uniform(2.0, 4.0))
    time.sleep(0.2)
    version, _ = register_version(storage, "outage", entry(1.0, f"run-{chaos_run}"))
    registry_outage.join()

    found = audit(storage)
    steps = [r["step"] for r in run.metrics() if "event" not in r]
    lost = bool(found["broken"]) or steps != list(range(1, STEPS + 1))
    url = run.spec.run.url
    by_ranks = set().union(
        *(retried(read_bytes(join(run.spec.run, f"nodes/{n}/log.txt")).decode(errors="replace"), url) for n in range(2))
    )
    by_supervisor = retried("\n".join(r.getMessage() for r in caplog.records), url)
    chaos_record(
        "storage: S3 down 2-8 s mid-run",
        data_lost=lost,
        outage_at_step=at_step,
        outage_s=round(length, 1),
        outage_hit_training=hit,
        complete=len(found["complete"]),
        incomplete=found["incomplete"],
        broken=found["broken"],
        retried_by_ranks=sorted(by_ranks)[:12],
        retried_by_supervisor=sorted(by_supervisor)[:6],
    )
    assert not found["broken"], found["broken"]
    assert steps == list(range(1, STEPS + 1))  # one uninterrupted trajectory, nothing lost or repeated
    complete = {url.rsplit("/", 1)[1] for url in found["complete"]}
    assert {"step-00000004", "step-00000008", "step-00000012", "final"} <= complete, found
    assert not [u for u in found["incomplete"] if "/checkpoints/" in u], found["incomplete"]
    assert (version, versions(storage, "outage")) == (1, [1])
    assert read_entry(storage, "outage", 1)["writer"] == f"run-{chaos_run}"


def test_s3_down_for_good_mid_run(chaos_run, chaos_rng, chaos_record, s3_stoppable, monkeypatch) -> None:
    endpoint, bucket = s3_stoppable
    storage = join(bucket, "tandem")
    staged = stage(str(storage), options=dict(storage.options))
    budget = 10
    monkeypatch.setenv(RETRY_ENV, str(budget))
    after = chaos_rng.uniform(1.0, 8.0)
    outage = endpoint.outage(after, None)
    with pytest.raises(TandemError) as info:
        # Long enough that the outage (1-8 s after this line) always falls inside training: the harness's 12 steps
        # can be over before it when the ranks start warm (tests/README.md, "Warm starts").
        train(staged, f"gone-{chaos_run}", ["launch.nnodes=2", "train.max_steps=400"])
    detect = time.monotonic() - outage.stopped_at  # type: ignore[attr-defined]
    first_line = str(info.value).splitlines()[0]
    endpoint.start()  # to audit what the failed run left
    found = audit(storage)
    chaos_record(
        "storage: S3 down for good mid-run",
        detect_s=round(detect, 1),
        data_lost=bool(found["broken"]),
        outage_at_s=round(after, 1),
        budget_s=budget,
        error=first_line,
        complete=len(found["complete"]),
        incomplete=len(found["incomplete"]),
        broken=found["broken"],
    )
    assert "storage unreachable" in first_line, str(info.value)[-3000:]
    assert f"is the endpoint at {endpoint.url} up? check AWS_ENDPOINT_URL" in first_line, first_line
    assert not found["broken"], found["broken"]
