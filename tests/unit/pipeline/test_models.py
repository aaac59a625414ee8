"""The base model as a local directory: a user's own as given; a built-in one kept under the digest of its recipe, so
that it is built once (on an object store, in the checkout's local cache)."""

from __future__ import annotations

import shutil
from pathlib import Path

from config.loader import load_config
from core.checkout import PROJECT_ROOT
from pipeline.models import resolve_model, tiny_model_url
from storage.location import Location


def test_a_users_model_is_taken_as_given(tiny_model) -> None:
    assert resolve_model(load_config(None, [f"model.name_or_path={tiny_model}"])) == tiny_model


def test_a_built_in_model_is_found_under_its_recipes_digest_and_not_built_again(tmp_path, tiny_model) -> None:
    storage = Location(str(tmp_path / "storage"))
    url = tiny_model_url(storage)
    assert str(url).startswith(f"{tmp_path}/storage/models/tiny-") and url == tiny_model_url(storage, "tiny")
    assert tiny_model_url(storage, "tiny-qwen2.5") != url
    shutil.copytree(tiny_model, str(url))  # what an earlier run built (COMPLETE last)
    marker = Path(str(url)) / "config.json"
    before = marker.stat().st_mtime_ns
    assert resolve_model(load_config(None, [f"run.storage={storage}"])) == str(url)
    assert marker.stat().st_mtime_ns == before  # found, not built again
    remote = tiny_model_url(Location("s3://bucket/tandem"))
    assert str(remote) == str(PROJECT_ROOT / ".tandem" / "models" / Path(str(url)).name)
