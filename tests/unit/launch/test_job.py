"""A phase's job (launch/job.py): what a started process is given, its spec's and its model's locations with their
options as one argument each, and the phase as one value: its name on the command line, the module its ranks run,
whether its nodes preflight (and so are sent spec.json's digest), whether it evaluates a model."""

from __future__ import annotations

import argparse

import pytest

from config.sections.launch import LaunchConfig
from launch.command import rank_environment
from launch.job import EVAL, PHASES, PROBE, TRAIN, Phase, node_args, phase_argument, trainer_args
from storage.location import Location

MINIO = {"endpoint_url": "http://minio:9000"}


def test_a_started_process_gets_the_specs_location_with_its_options_as_one_argument() -> None:
    """The ranks and node processes read spec.json with the options the run's storage needs (an endpoint of its own):
    they get them in --spec, parsed once by Location.parse; no environment variable carries them."""
    spec = Location("s3://tandem/runs/r1/spec.json", MINIO)
    args = trainer_args(spec, TRAIN)
    assert args[0] == "--spec" and len(args) == 2
    back = Location.parse(args[1])
    assert (back.url, dict(back.options)) == (spec.url, MINIO)
    node = node_args(spec, TRAIN, None, "ab" * 32)
    assert node == ["--spec", args[1], "--phase", "train", "--spec-digest", "ab" * 32]
    assert trainer_args(Location("/shared/runs/r1/spec.json"), TRAIN) == ["--spec", "/shared/runs/r1/spec.json"]
    assert not any("minio" in value for value in rank_environment(LaunchConfig()).values())


def test_the_evaluated_model_travels_as_a_location_with_its_options() -> None:
    """The task's location reaches the rank whole: `--model` is its command-line form, read back by Location.parse
    (trainer/evaluate.py `--model`); an eval node preflights nothing, so it gets no digest."""
    spec = Location("s3://tandem/runs/r1/spec.json", MINIO)
    model = Location("s3://tandem/runs/r1/final", MINIO)
    ranks = trainer_args(spec, EVAL, model)
    assert ranks[2] == "--model" and Location.parse(ranks[3]) == model
    assert dict(Location.parse(ranks[3]).options) == MINIO
    node = node_args(spec, EVAL, model, "ab" * 32)
    assert node == ["--spec", ranks[1], "--phase", "eval", "--model", ranks[3]]
    plain = Location("/shared/runs/r1/checkpoints/step-00000004")
    assert trainer_args(Location("/s.json"), EVAL, plain) == ["--spec", "/s.json", "--model", plain.url]
    # Only a phase that evaluates a model passes one on.
    assert trainer_args(spec, TRAIN, model) == ranks[:2] and "--model" not in node_args(spec, PROBE, model, "d")


def test_each_phase_names_its_module_its_preflight_and_its_model() -> None:
    assert [(p.name, p.module, p.preflights, p.takes_model) for p in PHASES.values()] == [
        ("train", "trainer", True, False),
        ("eval", "trainer.evaluate", False, True),
        ("probe", "trainer.watch.probe", True, False),
    ]
    assert all(Phase.named(name) is phase and str(phase) == name for name, phase in PHASES.items())


def test_a_phase_name_is_parsed_once_and_an_unknown_one_names_the_choices() -> None:
    assert phase_argument("probe") is PROBE
    with pytest.raises(ValueError, match=r"^phase 'tune' is none of train, eval, probe$"):
        Phase.named("tune")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^phase 'Train' is none of train, eval, probe$"):
        phase_argument("Train")
