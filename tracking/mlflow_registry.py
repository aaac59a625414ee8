"""Mirror Tandem's model registry into MLflow's: each registered version as a version of the same registered model,
the `champion` alias as MLflow's alias of that name.

Tandem's registry commits first and stays the source of truth. A version's mirror is recorded beside its entry
(`registry/{model}/mlflow/v{n:04d}.json`, storage/registry.py): `pending` until MLflow has the version, then `done`
with MLflow's version number. `sync` completes what is pending (the next run with MLflow does, and
`python -m flows.registry sync`). The alias follows champion.json: set to the champion's MLflow version once that is
mirrored, removed while it is not, so it never names a model Tandem's champion.json does not.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from importlib.metadata import version as package_version
from typing import Any

from storage import layout
from storage.fs import filesystem
from storage.location import Location, is_local, join, local_path
from storage.metrics import eval_metric_keys
from storage.registry import champion, read_entry, read_mirror, versions, write_mirror
from storage.spec import load_spec
from tracking.mlflow_sink import RUN_TAG, find_run, make_client
from tracking.sink import first_line

ALIAS = "champion"
PENDING, DONE = "pending", "done"
VERSION_TAG = "tandem.version"
LINEAGE_TAGS = (
    "dataset_id",
    "dataset_manifest_digest",
    "spec_digest",
    "code_version",
    "checkpoint_manifest_digest",
    "flow_run_id",
)
DEFAULT_EXPERIMENT = "tandem"


def artifact_name(model: str, version: int) -> str:
    """Where in its MLflow run a registered version's model is logged."""
    return f"{model}-v{version:04d}"


def requirements() -> list[str]:
    """What loading the pyfunc model needs (given, so that MLflow does not load the model to infer it)."""
    return ["tandem", *(f"{name}=={package_version(name)}" for name in ("torch", "transformers", "peft"))]


def experiment_of(entry: dict[str, Any], storage: Location) -> str:
    """The MLflow experiment the version's run was tracked in (its spec's track.mlflow_experiment)."""
    try:
        return load_spec(join(storage.with_url(entry["run_url"]), layout.SPEC))[0].config.track.mlflow_experiment
    except Exception:  # noqa: BLE001 - a run directory that is gone: the default experiment
        return DEFAULT_EXPERIMENT


def save_pyfunc(export: str, saved: str, *, trust_remote_code: bool = False) -> None:
    """Save a local export directory as a pyfunc model (TandemModel, the export as its `model` artifact) at `saved`;
    `trust_remote_code` (the run's model.trust_remote_code) is what loading it passes to transformers."""
    import mlflow.pyfunc

    from tracking.mlflow_model import TandemModel

    mlflow.pyfunc.save_model(
        saved,
        python_model=TandemModel(),
        artifacts={"model": export},
        model_config={"trust_remote_code": trust_remote_code},
        pip_requirements=requirements(),
    )


def log_model(client: Any, mlflow_run_id: str, entry: dict[str, Any], storage: Location) -> str:
    """Save the export as a pyfunc model and log it into the run; returns its artifact URI."""
    with tempfile.TemporaryDirectory(prefix="tandem-mlflow-") as tmp:
        model_url = storage.with_url(entry["model_url"])
        if is_local(model_url):
            export = local_path(model_url)
        else:
            export = os.path.join(tmp, "export")
            fs, path = filesystem(model_url)
            fs.get(path, export, recursive=True)
        saved = os.path.join(tmp, "pyfunc")
        save_pyfunc(export, saved, trust_remote_code=bool(entry.get("trust_remote_code")))
        name = artifact_name(entry["model"], entry["version"])
        client.log_artifacts(mlflow_run_id, saved, name)
    return f"{client.get_run(mlflow_run_id).info.artifact_uri}/{name}"


def mirror_version(client: Any, storage: Location, model: str, version: int) -> int:
    """Register Tandem's `model` v`version` in MLflow (once: a version already tagged with it is reused); returns
    MLflow's version number."""
    from mlflow.exceptions import MlflowException

    existing = client.search_model_versions(f"name = '{model}' and tags.`{VERSION_TAG}` = '{version}'")
    if existing:
        return int(existing[0].version)
    entry = read_entry(storage, model, version)
    run_id = entry["run_url"].rstrip("/").rsplit("/", 1)[-1]
    _, mlflow_run_id, _ = find_run(client, experiment_of(entry, storage), run_id, {RUN_TAG: run_id})
    source = log_model(client, mlflow_run_id, entry, storage)
    try:
        client.create_registered_model(model, tags={"tandem.registry": str(layout.registry_dir(storage, model))})
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    lineage = entry["lineage"]
    tags = {
        VERSION_TAG: str(version),
        "tandem.entry_digest": entry["digest"],
        "tandem.model_url": entry["model_url"],
        **{f"tandem.{key}": str(lineage[key]) for key in LINEAGE_TAGS if lineage.get(key) is not None},
        **{f"tandem.eval_{key}": str(entry["metrics"][key]) for key in eval_metric_keys(entry["metrics"])},
    }
    created = client.create_model_version(model, source, run_id=mlflow_run_id, tags=tags)
    return int(created.version)


def sync_alias(client: Any, storage: Location, model: str) -> str:
    """Point MLflow's `champion` alias at the MLflow version of Tandem's champion, or remove it while that version
    is not mirrored; returns what it did."""
    alias = champion(storage, model)
    record = read_mirror(storage, model, alias["version"]) if alias else None
    if alias is not None and record is not None and record["status"] == DONE:
        client.set_registered_model_alias(model, ALIAS, str(record["mlflow_version"]))
        return f"{ALIAS} -> MLflow version {record['mlflow_version']} (Tandem v{alias['version']:04d})"
    with contextlib.suppress(Exception):  # no such model or alias: nothing to remove
        client.delete_registered_model_alias(model, ALIAS)
    return f"{ALIAS} alias removed (Tandem's champion is not mirrored yet)"


def sync(storage: Location, model: str, uri: str, info: Callable[[str], None]) -> bool:
    """Mirror every version of `model` MLflow does not hold yet, then the alias. When MLflow fails (down, refusing),
    that version and the later ones are recorded `pending` for a later sync (the entries' URLs are reached with the
    storage's options). Returns whether all is mirrored."""
    client = make_client(uri)
    failure: str | None = None
    for version in versions(storage, model):
        record = read_mirror(storage, model, version)
        if record is not None and record["status"] == DONE:
            continue
        if failure is None:
            try:
                mlflow_version = mirror_version(client, storage, model, version)
                write_mirror(storage, model, version, DONE, uri, mlflow_version=mlflow_version)
                info(f"MLflow: {model} v{version:04d} registered as MLflow version {mlflow_version}")
                continue
            except Exception as exc:  # noqa: BLE001 - MLflow down or refusing: recorded, completed by a later sync
                failure = first_line(exc)
        write_mirror(storage, model, version, PENDING, uri, reason=failure)
        info(
            f"MLflow: the mirror of {model} v{version:04d} is pending ({failure}); the next run tracked in MLflow "
            f"or `python -m flows.registry sync {model}` completes it"
        )
    try:
        info(f"MLflow: {sync_alias(client, storage, model)}")
    except Exception as exc:  # noqa: BLE001 - MLflow down or refusing: recorded, completed by a later sync
        failure = failure or first_line(exc)
        info(f"MLflow: the {ALIAS} alias of {model} was not updated ({first_line(exc)})")
    return failure is None
