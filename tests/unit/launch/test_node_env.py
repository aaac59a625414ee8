"""What a node process is given (launch/node_env.py): its place from the environment, in Qwen's names with their
by-hand defaults, a Kubeflow TrainJob's PET_* or an indexed Job's completion index standing in for unset ones, a
value that is not a number refused in one line naming the variable; and its job read back from spec.json."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.loader import load_config
from core.errors import UserError
from launch.job import EVAL, TRAIN
from launch.node_env import node_job, plan_from_environment
from pipeline.plan import build_spec
from storage.location import Location
from storage.spec import DatasetRef, publish_spec
from tests.specs import spec_for

ENDPOINT = "http://127.0.0.1:9000"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, (0, 1, "localhost", 6001, 8)),  # by hand on one machine: Qwen's defaults, every GPU (here: the spec's)
        (
            {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "6100", "GPUS_PER_NODE": "4"},
            (1, 2, "10.0.0.5", 6100, 4),
        ),
        (
            {"JOB_COMPLETION_INDEX": "3", "NNODES": "4", "MASTER_ADDR": "n0.svc", "MASTER_PORT": "6001"},
            (3, 4, "n0.svc", 6001, 8),
        ),
        (
            {
                "PET_NODE_RANK": "1",
                "PET_NNODES": "2",
                "PET_MASTER_ADDR": "tj-node-0-0.tj",
                "PET_MASTER_PORT": "29400",
                "PET_NPROC_PER_NODE": "auto",
            },
            (1, 2, "tj-node-0-0.tj", 29400, 8),
        ),
        ({"NODE_RANK": "0", "PET_NODE_RANK": "1", "JOB_COMPLETION_INDEX": "2"}, (0, 1, "localhost", 6001, 8)),
        ({"PET_NODE_RANK": "1", "JOB_COMPLETION_INDEX": "2"}, (1, 1, "localhost", 6001, 8)),
    ],
)
def test_the_node_takes_its_place_from_qwens_names_or_what_the_controller_injects(
    environ: dict[str, str], expected: tuple
) -> None:
    plan = plan_from_environment(8, environ)
    assert (plan.node_rank, plan.nnodes, plan.master_addr, plan.master_port, plan.nproc_per_node) == expected


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        ({"NODE_RANK": "one"}, "NODE_RANK='one': must be a non-negative integer"),
        ({"PET_NNODES": "-2"}, "PET_NNODES='-2': must be a non-negative integer"),
        ({"GPUS_PER_NODE": "8 "}, "GPUS_PER_NODE='8 ': must be a non-negative integer"),
    ],
)
def test_a_place_that_is_not_a_number_is_one_line_naming_the_variable(environ: dict[str, str], said: str) -> None:
    with pytest.raises(UserError) as info:
        plan_from_environment(8, environ)
    assert str(info.value) == said


def test_the_process_environment_is_read_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_RANK", "2")
    monkeypatch.setenv("NNODES", "3")
    assert plan_from_environment(1).node_rank == 2


def test_the_nodes_job_is_the_spec_read_back_with_the_digest_the_pipeline_sent(tmp_path: Path) -> None:
    cfg = load_config(None, [f"run.storage={tmp_path}", "train.max_steps=4"])
    dataset = DatasetRef(dataset_id="d", url=str(tmp_path), manifest_digest="x", split_records={"train": 10})
    written = publish_spec(build_spec(cfg, "r", str(tmp_path), dataset))
    job = node_job(written.url, TRAIN, None, None)
    assert job.written.spec.model_dump(mode="json") == written.spec.model_dump(mode="json")  # as written
    assert (job.written.digest, str(job.written.url)) == (written.digest, str(written.url))
    assert job.args == ["--spec", str(written.url)] and job.env == {}
    sent = node_job(written.url, EVAL, Location("/m"), "0" * 64)  # preflight holds the bytes against the sent digest
    assert sent.written.digest == "0" * 64 and sent.args == ["--spec", str(written.url), "--model", "/m"]


def test_a_model_given_as_a_plain_url_is_reached_with_the_runs_options(tmp_path: Path) -> None:
    """A node started by hand may name the model by its URL alone: it lives under the run's storage, so the ranks get
    it with the run's options; a location that carries options of its own (the pipeline's) keeps them."""
    written = publish_spec(spec_for(tmp_path, [f"run.storage_options={{endpoint_url: '{ENDPOINT}'}}"]))
    final = f"{tmp_path}/runs/r/final"
    job = node_job(Location(written.url.url), EVAL, Location(final), None)
    assert job.model is not None and (job.model.url, dict(job.model.options)) == (final, {"endpoint_url": ENDPOINT})
    assert Location.parse(job.args[job.args.index("--model") + 1]).options == {"endpoint_url": ENDPOINT}
    own = node_job(written.url, EVAL, Location(final, {"anon": True}), None).model
    assert own is not None and dict(own.options) == {"anon": True}
