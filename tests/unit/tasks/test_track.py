"""The tracking tasks against the session's Prefect server: one link artifact per tracking system that shows the run,
its key made of what Prefect allows in one."""

from __future__ import annotations

from prefect.logging import disable_run_logger

from tasks.track import link_tracking


def test_each_system_gets_a_link_artifact_with_a_valid_key(prefect_server) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    links = {"MLflow": "http://mlflow:5000/#/experiments/1/runs/abc", "W&B": "https://wandb.ai/me/tandem/runs/r-1"}
    with disable_run_logger():
        link_tracking.fn("r-1", links)
    with get_client(sync_client=True) as client:
        found = {
            key: client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                sort=ArtifactSort.CREATED_DESC,
                limit=1,
            )
            for key in ("mlflow-run", "wb-run")
        }
    assert [a.type for a in found["mlflow-run"]] == ["markdown"] and links["MLflow"] in found["mlflow-run"][0].data
    assert "[W&B: run r-1](https://wandb.ai/me/tandem/runs/r-1)" in found["wb-run"][0].data
