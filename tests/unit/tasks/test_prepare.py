"""The prepare tasks: the base model resolved, the dataset staged, and the staging task's cache key, which exists only
once a complete dataset is staged for these inputs and changes when that dataset's files do (a deleted or restaged
dataset is staged again, never taken from Prefect's cache)."""

from __future__ import annotations

from prefect.logging import disable_run_logger

from config.loader import load_config
from tasks.prepare import dataset_cache_key, prepare_dataset, prepare_model
from tests.datafiles import arithmetic, write_jsonl


def test_the_cache_key_follows_the_staged_dataset(tmp_path, tiny_model) -> None:
    source = write_jsonl(tmp_path / "a.jsonl", arithmetic(30))
    cfg = load_config(
        None, [f"run.storage={tmp_path / 's'}", f"data.source={source}", f"model.name_or_path={tiny_model}"]
    )
    with disable_run_logger():
        model = prepare_model.fn(cfg)
        parameters = {"cfg": cfg, "model_path": model}
        assert model == tiny_model and dataset_cache_key(None, parameters) is None  # nothing staged yet: no caching
        dataset = prepare_dataset.fn(cfg, model)
    key = dataset_cache_key(None, parameters)
    assert key is not None and dataset_cache_key(None, parameters) == key
    next((tmp_path / "s" / "datasets" / dataset.dataset_id / "train").iterdir()).unlink()
    assert dataset_cache_key(None, parameters) not in (None, key)  # a shard gone: another key, so staged again
    broken = {"cfg": cfg, "model_path": str(tmp_path / "no-model")}
    assert dataset_cache_key(None, broken) is None  # the task itself reports the problem
