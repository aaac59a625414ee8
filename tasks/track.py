"""Link the run's pages in the tracking systems (MLflow) from the Prefect UI, and mirror the registry into MLflow's."""

from __future__ import annotations

import re

from prefect import get_run_logger, task
from prefect.artifacts import create_link_artifact

from storage.location import Location


@task(name="link-tracking")
def link_tracking(run_id: str, links: dict[str, str]) -> None:
    """One Prefect link artifact per tracking system whose UI shows this run."""
    for system, url in links.items():
        key = re.sub(r"[^a-z0-9]+", "", system.lower()) + "-run"  # artifact keys: lower-case letters, digits, dashes
        create_link_artifact(
            key=key,
            link=url,
            link_text=f"{system}: run {run_id}",
            description=f"run {run_id} in {system} (metrics by step, config, lineage, files)",
        )
        get_run_logger().info("%s: %s", system, url)


@task(name="mirror-registry")
def mirror_registry(storage: Location, model: str, uri: str) -> bool:
    """After Tandem's registry committed: mirror what MLflow's model registry lacks of `model` and the champion alias
    (pending where MLflow fails; never fails the run). Returns whether everything is mirrored."""
    from tracking.mlflow_registry import sync

    logger = get_run_logger()
    return sync(storage, model, uri, logger.info)
