"""Link the run's pages in the tracking systems (MLflow) from the Prefect UI."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_link_artifact


@task(name="link-tracking")
def link_tracking(run_id: str, links: dict[str, str]) -> None:
    """One Prefect link artifact per tracking system whose UI shows this run."""
    for system, url in links.items():
        create_link_artifact(key=f"{system.lower()}-run", link=url, link_text=f"{system}: run {run_id}",
                             description=f"run {run_id} in {system} (metrics by step, config, lineage, files)")
        get_run_logger().info("%s: %s", system, url)
