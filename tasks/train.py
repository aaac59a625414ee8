"""Train: verify the staged data, then run the trainer on every node and wait for all of them."""

from __future__ import annotations

from prefect import get_run_logger, task

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
    run_local_nodes(spec.run_url, spec.config.launch, "trainer", ["--spec", spec_url], "train", logger.info)
