"""The prepare flow and its staging task under a real Prefect server: the task cache is keyed on the source
digests and the settings, and misses when the staged files are deleted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from prefect import flow

from config.loader import load_config
from core.errors import UserError
from storage.location import Location
from storage.manifest import verify_dataset
from tasks.prepare import prepare_dataset
from tests.datafiles import arithmetic, qwen, write_jsonl


@pytest.fixture
def results(prefect_server, tmp_path):
    """Persisted task results (what the cache reads) in a temporary folder."""
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings

    with temporary_settings({PREFECT_LOCAL_STORAGE_PATH: str(tmp_path / "results")}):
        yield


@flow
def stage_once(cfg, model_path: str) -> tuple[str, object]:
    """The staging task as the prepare flow calls it; returns its final state's name and result."""
    state = prepare_dataset(cfg, model_path, return_state=True)
    return state.name, state.result()


def test_task_cache_hits_for_unchanged_input_and_misses_when_files_are_gone(results, tmp_path, tiny_model) -> None:
    source = write_jsonl(tmp_path / "d.jsonl", arithmetic(40))
    storage = tmp_path / "storage"
    cfg = load_config(
        None,
        [f"data.source={source}", f"run.storage={storage}", "data.max_length=128", f"model.name_or_path={tiny_model}"],
    )
    name, first = stage_once(cfg, tiny_model)
    assert name == "Completed"  # nothing staged yet: no key, nothing cached
    name, second = stage_once(cfg, tiny_model)
    assert (name, second) == ("Completed", first)  # found already staged; its result is cached from now on
    name, third = stage_once(cfg, tiny_model)
    assert (name, third) == ("Cached", first)

    other = cfg.model_copy(update={"data": cfg.data.model_copy(update={"max_length": 96})})
    assert stage_once(other, tiny_model)[0] == "Completed"

    Path(source).write_text(Path(source).read_text() + "\n")  # same records, new bytes: a new source digest
    name, same = stage_once(cfg, tiny_model)
    assert name == "Completed" and same.dataset_id == first.dataset_id

    shutil.rmtree(storage / "datasets" / first.dataset_id / "train")
    name, restaged = stage_once(cfg, tiny_model)
    assert name == "Completed" and restaged.dataset_id == first.dataset_id
    verify_dataset(Location(restaged.url), "full", restaged.manifest_digest)


def test_prepare_flow_returns_the_model_and_the_staged_dataset(results, tmp_path, tiny_model) -> None:
    from flows.prepare import prepare

    cfg = load_config(None, [f"run.storage={tmp_path / 'storage'}", f"model.name_or_path={tiny_model}"])
    model_path, dataset = prepare(cfg)
    assert model_path == tiny_model
    assert verify_dataset(Location(dataset.url), "full", dataset.manifest_digest)["records"]["staged"] == 240


def test_bad_data_fails_the_flow_with_the_location(results, tmp_path, tiny_model) -> None:
    from flows.prepare import prepare

    source = write_jsonl(tmp_path / "d.jsonl", [*arithmetic(3), qwen(("user", "no answer"))])
    cfg = load_config(
        None, [f"data.source={source}", f"run.storage={tmp_path / 's'}", f"model.name_or_path={tiny_model}"]
    )
    with pytest.raises(UserError, match=rf"^{source}:4: no assistant turn"):
        prepare(cfg)
