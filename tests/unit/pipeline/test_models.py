"""The base model as a local directory: a user's own as given; a built-in one kept under the digest of its recipe, so
that it is built once (on an object store, in the checkout's local cache)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from config.loader import load_config
from config.schema import FinetuneConfig
from config.sections.model_train import ModelConfig
from config.sections.results import RegisterConfig
from core.checkout import PROJECT_ROOT
from pipeline.models import model_name_of, registry_name, resolve_model, tiny_model_url, toy_length_note
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


@pytest.mark.parametrize(
    ("name_or_path", "expected"),
    [
        ("Qwen/Qwen2.5-0.5B-Instruct", "qwen2.5-0.5b-instruct"),
        ("/models/Qwen3-30B-A3B/", "qwen3-30b-a3b"),
        ("s3://bucket/models/Llama 3 (8B)", "llama-3-8b"),
        ("/root/.cache/huggingface/hub/models--Qwen--Qwen2.5-7B-Instruct/snapshots/a09a354", "qwen2.5-7b-instruct"),
        ("_private", "private"),
        ("tiny", "tandem-tiny"),
        ("tiny-qwen2.5", "tandem-tiny-qwen2.5"),
    ],
)
def test_a_run_is_named_after_its_model(name_or_path: str, expected: str) -> None:
    assert model_name_of(name_or_path) == expected
    model = ModelConfig(name_or_path=name_or_path)
    assert registry_name(FinetuneConfig(model=model)) == expected
    assert registry_name(FinetuneConfig(model=model, register=RegisterConfig(model_name="mine"))) == "mine"


def test_a_directory_the_built_in_recipe_made_keeps_its_name_and_a_users_copy_of_it_does_not(tmp_path, tiny_model):
    assert model_name_of(tiny_model) == "tandem-tiny"
    assert registry_name(load_config(None, [])) == "tandem-tiny"  # the default preset names no model of its own
    assert registry_name(load_config(None, [f"model.name_or_path={tiny_model}"])) == "tandem-tiny"
    mine = tmp_path / "My-Model"
    shutil.copytree(tiny_model, mine)
    (mine / "COMPLETE").unlink()
    assert model_name_of(str(mine)) == "my-model"


def test_a_real_model_at_the_default_presets_length_is_told_so(tmp_path, tiny_model) -> None:
    real = tmp_path / "Qwen2.5-0.5B-Instruct"
    real.mkdir()
    note = toy_length_note(load_config(None, [f"model.name_or_path={real}"]))
    assert note == (
        f"data.max_length=256 is the tiny-cpu preset's, sized for its built-in tiny model; {real} is a real model: "
        "set data.max_length to what it and your records need (e.g. 2048)"
    )
    assert toy_length_note(load_config(None, [f"model.name_or_path={real}", "data.max_length=2048"])) is None
    assert toy_length_note(load_config(None, [f"model.name_or_path={tiny_model}"])) is None
    assert toy_length_note(load_config(None, [])) is None
