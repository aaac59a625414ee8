"""Train: verify the staged data, then run the trainer on every node and wait for all of them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from config.manifest import read_manifest, verify_files
from config import layout
from config.spec import Spec
from tasks.local_nodes import run_local_nodes


def verify_dataset(spec: Spec) -> None:
    """Full digest check of the staged dataset against its manifest (and the manifest against the spec)."""
    manifest, digest = read_manifest(spec.dataset.url, layout.DATASET_SCHEMA)
    if digest != spec.dataset.manifest_digest:
        raise_mismatch(spec, digest)
    verify_files(spec.dataset.url, manifest, mode="full")


def raise_mismatch(spec: Spec, digest: str) -> None:
    """The dataset manifest changed since the spec was written."""
    from config.errors import UserError

    raise UserError(f"{spec.dataset.url}/{layout.MANIFEST}: digest {digest} != {spec.dataset.manifest_digest} "
                    "recorded in spec.json; the staged dataset changed, prepare it again")


@task(name="train")
def train_on_nodes(spec: Spec, spec_url: str) -> None:
    """Launch `python -m trainer` on every node; returns when all ranks finished."""
    logger = get_run_logger()
    # The local backend's nodes share this machine's files, so one verification covers all of them.
    verify_dataset(spec)
    logger.info("dataset %s verified (%s)", spec.dataset.dataset_id, spec.config.data.digest_algorithm)
    run_local_nodes(spec.run_url, spec.config.launch, "trainer", ["--spec", spec_url], "train", logger.info,
                    on_progress=progress_reporter(spec.total_steps, logger.info))


def progress_reporter(total: int, info: Callable[[str], None]) -> Callable[[dict[str, Any]], None]:
    """A callback that logs step/total, loss, tokens/s and ETA, and keeps a Prefect progress artifact."""
    artifact = create_progress_artifact(progress=0.0, key="training-progress", description="training steps done")
    started = time.monotonic()

    def report(record: dict[str, Any]) -> None:
        step = record["step"]
        eta = (time.monotonic() - started) / step * (total - step)
        info(f"step {step}/{total} loss {record['loss']:.4f} tokens/s {record['tokens_per_s']:.0f} ETA {eta:.0f} s")
        update_progress_artifact(artifact_id=artifact, progress=100.0 * step / total)

    return report
