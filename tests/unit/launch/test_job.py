"""A phase's job (launch/job.py): what a started process is given, its spec's location with its options as one
argument."""

from __future__ import annotations

from config.sections.launch import LaunchConfig
from launch.command import rank_environment
from launch.job import node_args, trainer_args
from storage.location import Location


def test_a_started_process_gets_the_specs_location_with_its_options_as_one_argument() -> None:
    """The ranks and node processes read spec.json with the options the run's storage needs (an endpoint of its own):
    they get them in --spec, parsed once by Location.parse; no environment variable carries them."""
    spec = Location("s3://tandem/runs/r1/spec.json", {"endpoint_url": "http://minio:9000"})
    args = trainer_args(spec, "eval", "s3://tandem/runs/r1/final")
    assert args[0] == "--spec" and args[2:] == ["--model", "s3://tandem/runs/r1/final"]
    back = Location.parse(args[1])
    assert (back.url, dict(back.options)) == (spec.url, {"endpoint_url": "http://minio:9000"})
    node = node_args(spec, "train", None, "ab" * 32)
    assert node == ["--spec", args[1], "--phase", "train", "--spec-digest", "ab" * 32]
    assert trainer_args(Location("/shared/runs/r1/spec.json"), "train") == ["--spec", "/shared/runs/r1/spec.json"]
    assert not any("minio" in value for value in rank_environment(LaunchConfig()).values())
