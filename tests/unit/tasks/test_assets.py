"""The registered model and its dataset as Prefect assets: keys that name the same objects as the registry entry
(file:// for local paths, storage URLs as they are), with the characters Prefect refuses replaced."""

from __future__ import annotations

from storage.location import Location
from tasks.assets import asset_key, dataset_asset, model_asset
from tasks.register import Registration
from tests.registry_helpers import entry
from tests.specs import spec_for


def test_keys_name_the_storage_objects() -> None:
    assert asset_key(Location("/data/runs/r 1/final")) == "file:///data/runs/r_1/final"
    assert asset_key(Location("s3://models/tandem/runs/r#2/final")) == "s3://models/tandem/runs/r_2/final"


def test_the_model_and_its_dataset(tmp_path) -> None:
    registered = Registration(True, "tiny v0002 (champion)", 2, "/s/registry/tiny/v0002.json", True, entry(1.5, "w"))
    spec = spec_for(tmp_path, [])
    model = model_asset(spec, registered)
    assert model.key == "file:///models/w" and model.properties.name == "tiny v0002"
    assert model.properties.description == "lora model, registry entry /s/registry/tiny/v0002.json"
    dataset = dataset_asset(spec)
    assert dataset.key == f"file://{tmp_path}" and dataset.properties.name == "d"
