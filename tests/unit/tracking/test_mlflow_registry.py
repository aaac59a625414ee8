"""Tandem's registry mirrored into MLflow's (its client on a SQLite store, which holds a model registry as a server's
database does): each version once, as a pyfunc model with the lineage as tags, the champion alias following
champion.json; with MLflow away, versions are recorded pending and a later sync completes them."""

from __future__ import annotations

import pytest

from launch.command import free_port
from storage.location import Location
from storage.registry import promote, read_entry, read_mirror, register_version
from tests.registry_helpers import entry
from tracking.mlflow_registry import ALIAS, DONE, PENDING, VERSION_TAG, artifact_name, sync
from tracking.mlflow_sink import make_client


@pytest.fixture
def uri(tmp_path, monkeypatch) -> str:
    for key in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)  # a SQLite store keeps its artifacts beside the working directory
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def registered(storage: Location, model_dir: str, loss: float, run: str) -> int:
    body = {**entry(loss, run), "model_url": model_dir, "run_url": f"/nowhere/runs/{run}"}
    version, _ = register_version(storage, "tiny", body)
    promote(storage, "tiny", version, read_entry(storage, "tiny", version)["metrics"], "loss", "min")
    return version


def test_versions_are_mirrored_once_pending_while_mlflow_is_away_and_the_alias_follows(uri, tmp_path, tiny_model):
    storage = Location(str(tmp_path / "storage"))
    registered(storage, tiny_model, 2.0, "r1")
    lines: list[str] = []
    assert not sync(storage, "tiny", f"http://127.0.0.1:{free_port()}", lines.append)  # MLflow away
    pending = read_mirror(storage, "tiny", 1)
    assert pending["status"] == PENDING and pending["reason"]
    assert "the mirror of tiny v0001 is pending" in lines[0] and "flows.registry sync tiny" in lines[0]
    registered(storage, tiny_model, 1.5, "r2")
    lines.clear()
    assert sync(storage, "tiny", uri, lines.append) and sync(storage, "tiny", uri, lines.append)
    client = make_client(uri)
    versions = sorted(client.search_model_versions("name = 'tiny'"), key=lambda v: int(v.version))
    assert [v.tags[VERSION_TAG] for v in versions] == ["1", "2"]  # each once, however often synced
    assert versions[1].tags["tandem.dataset_id"] == "ds-0" and versions[1].tags["tandem.eval_loss"] == "1.5"
    assert versions[1].source.endswith(artifact_name("tiny", 2))
    assert int(client.get_model_version_by_alias("tiny", ALIAS).version) == 2
    assert read_mirror(storage, "tiny", 1)["status"] == DONE and read_mirror(storage, "tiny", 2)["mlflow_version"] == 2
    assert lines[:2] == [
        "MLflow: tiny v0001 registered as MLflow version 1",
        "MLflow: tiny v0002 registered as MLflow version 2",
    ]
    assert lines[-1] == f"MLflow: {ALIAS} -> MLflow version 2 (Tandem v0002)"
