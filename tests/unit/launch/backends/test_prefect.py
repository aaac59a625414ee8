"""The prefect backend (launch/backends/prefect.py): what it describes (each node's flow run of the node deployment:
its queue, its name and its parameters, which the `node` flow accepts), and its follow loop through an outage of the
Prefect API: the node flow runs read with the real Prefect client against a port where nothing listens, then on the
session's real server, and the nodes' own records as real status.json files."""

from __future__ import annotations

import inspect
import re
import uuid
from pathlib import Path

import pytest
import yaml
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import State
from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings
from prefect.states import Failed, Running

from config.loader import load_config
from flows.node import node
from launch.api_outage import ApiOutage, fail_fast
from launch.backends import prefect as prefect_backend
from launch.backends.prefect import NodeFlowRun, PrefectBackend
from launch.command import free_port
from launch.dry_run import planned_job
from launch.job import EVAL, TRAIN, Phase
from launch.node import ERROR_EXIT_CODE, recorded_end, status_url
from storage.fs import write_json_atomic
from storage.location import Location


def record(run: Location, rank: int, **status: object) -> None:
    write_json_atomic(status_url(run, rank), {"node_rank": rank, **status})


@pytest.mark.parametrize("phase", [TRAIN, EVAL])
def test_the_description_is_each_nodes_flow_run_with_parameters_the_node_flow_takes(phase: Phase) -> None:
    cfg = load_config(
        None,
        ["launch.backend=prefect", "launch.nnodes=3", "launch.queue_prefix=gpu-", "run.name=r7", "run.storage=/s"],
    )
    text = PrefectBackend().describe(planned_job(cfg, phase))
    assert text.startswith("# launch.backend=prefect: 3 flow run(s) of deployment node/node")
    runs = [yaml.safe_load(part) for part in re.split(r"^# node \d+\n", text, flags=re.M)[1:]]
    assert [(r["work_queue_name"], r["flow_run_name"]) for r in runs] == [
        (f"gpu-{rank}", f"r7-{phase}-node{rank}") for rank in range(3)
    ]
    accepted = set(inspect.signature(node.fn).parameters)
    for rank, run in enumerate(runs):
        parameters = run["parameters"]
        assert set(parameters) <= accepted and parameters["node_rank"] == rank and parameters["master_port"] == 6001
        assert parameters["spec"] == "/s/runs/r7/spec.json" and parameters["phase"] == phase.name
        assert parameters["expected_spec_digest"] == ("SPEC-DIGEST" if phase is TRAIN else None)
        assert parameters["model"] == ("/s/runs/r7/MODEL" if phase is EVAL else None)


def test_while_the_api_is_away_the_follow_loop_waits_without_retries(tmp_path: Path) -> None:
    """Even a node that recorded its end is not taken as ended while the API is away: the pipeline's own engine needs
    the API to go on, so the phase ends once it is back."""
    run = Location(str(tmp_path / "run"))
    record(run, 0, phase="train", exit_code=0)
    with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{free_port()}/api"}):
        outage = ApiOutage(60, "the nodes go on")
        with fail_fast(), get_client(sync_client=True) as client:
            assert PREFECT_CLIENT_MAX_RETRIES.value() == 0  # Prefect's own retries back off for about a minute
            assert [NodeFlowRun(r, uuid.uuid4(), client, run, TRAIN, outage).returncode() for r in (0, 1)] == [
                None,
                None,
            ]
    assert outage.happened and outage.since is not None


def test_the_nodes_records_decide_where_their_flow_runs_could_not_report(
    tmp_path: Path, prefect_server: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the session's real server, once the API is back: node 0's flow run ended Failed on an API error but its node
    finished (corrected to Completed); node 1's stayed Running after the outage (its engine gave up) but its node
    finished; node 2 failed with bad data (2) and stays failed; node 3's record is the eval phase's: no news."""
    monkeypatch.setattr(prefect_backend, "REPORT_GRACE_S", 0.0)
    run = Location(str(tmp_path / "run"))
    record(run, 0, phase="train", exit_code=0)
    record(run, 1, phase="train", exit_code=0)
    record(run, 2, phase="train", exit_code=1, **{ERROR_EXIT_CODE: 2})
    record(run, 3, phase="eval", exit_code=0)
    assert [recorded_end(run, rank, TRAIN) for rank in range(4)] == [0, 0, 2, None]
    states: list[State] = [
        Failed(message="ConnectError: [Errno 111] Connection refused"),
        Running(),
        Failed(message="bad"),
        Running(),
    ]
    outage = ApiOutage(60, "the nodes go on")
    outage.happened = True
    with get_client(sync_client=True) as client:
        runs = []
        for rank, state in enumerate(states):
            flow_run = client.create_flow_run(outage_probe, state=state)
            runs.append(NodeFlowRun(rank, flow_run.id, client, run, TRAIN, outage))
        assert [r.returncode() for r in runs] == [0, 0, 1, None]
        after = [client.read_flow_run(r.run_id).state for r in runs]
    assert [s.name if s else None for s in after] == ["Completed", "Completed", "Failed", "Running"]
    for corrected in after[:2]:
        assert corrected is not None and "could not report its end" in (corrected.message or ""), corrected


@flow(name="outage-probe")
def outage_probe() -> None:
    """Only its flow runs are made (their states set by the test), never run."""
