"""The names of everything Tandem writes on storage (docs/architecture.md, "On storage"), and the run's storage options
travelling with every place under it."""

from __future__ import annotations

from config.sections.run_data import RunConfig
from storage import layout
from storage.location import Location


def test_the_places_of_a_run_are_the_documented_ones() -> None:
    storage = Location("/mnt/shared/tandem")
    run = layout.run_dir(RunConfig(storage="/mnt/shared/tandem"), "r1")
    assert str(run) == "/mnt/shared/tandem/runs/r1"
    assert str(layout.checkpoint_dir(run, 120)) == "/mnt/shared/tandem/runs/r1/checkpoints/step-00000120"
    assert str(layout.universal_dir(layout.checkpoint_dir(run, 120))).endswith("step-00000120/universal")
    assert str(layout.node_dir(run, 3)) == "/mnt/shared/tandem/runs/r1/nodes/3"
    assert str(layout.final_dir(run)) == "/mnt/shared/tandem/runs/r1/final"
    assert str(layout.run_lock_url(run)) == "/mnt/shared/tandem/runs/r1/LOCK"
    assert layout.rank_dir_name(7) == "rank-00007"
    assert str(layout.dataset_dir(storage, "ds-1")) == "/mnt/shared/tandem/datasets/ds-1"
    assert str(layout.dataset_index(storage, "k")) == "/mnt/shared/tandem/datasets/by-source/k.json"
    assert layout.shard_name("eval", 12) == "eval/shard-00012.arrow"


def test_the_registry_of_a_model() -> None:
    storage = Location("s3://models/tandem")
    assert str(layout.registry_dir(storage, "qwen-sft")) == "s3://models/tandem/registry/qwen-sft"
    assert layout.registry_entry_name(3) == "v0003.json"
    assert str(layout.champion_url(storage, "m")) == "s3://models/tandem/registry/m/champion.json"
    assert str(layout.mirror_url(storage, "m", 12)) == "s3://models/tandem/registry/m/mlflow/v0012.json"


def test_the_run_storage_options_reach_every_place_under_it() -> None:
    run = RunConfig(storage="s3://bucket/tandem", storage_options={"endpoint_url": "http://h:9000"})
    assert layout.root(run).options == {"endpoint_url": "http://h:9000"}
    place = layout.checkpoint_dir(layout.run_dir(run, "r1"), 5)
    assert isinstance(place, Location) and place.options == {"endpoint_url": "http://h:9000"}
    assert str(place) == "s3://bucket/tandem/runs/r1/checkpoints/step-00000005"
