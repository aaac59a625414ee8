"""A Prefect API that does not answer while the nodes train (launch/backends/prefect_api.py and prefect.py): the
pipeline's follow loop reads its node flow runs with the real Prefect client against a port where nothing listens,
and the nodes' own records are real status.json files. The whole story (the cluster's server stopped and restarted
under a training run) is tests/cluster/test_api_outage.py."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import State
from prefect.exceptions import PrefectHTTPStatusError
from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings
from prefect.states import Failed, Running

from core.errors import EXIT_RETRYABLE, RetryableError
from launch.backends import prefect as prefect_backend
from launch.backends.prefect import NodeFlowRun
from launch.backends.prefect_api import ApiOutage, fail_fast, unreachable
from launch.command import free_port
from launch.node import ERROR_EXIT_CODE, recorded_end, status_url
from storage.fs import write_json_atomic
from storage.location import Location


def record(run: Location, rank: int, **status: object) -> None:
    write_json_atomic(status_url(run, rank), {"node_rank": rank, **status})


def test_only_an_api_that_cannot_answer_counts_as_an_outage() -> None:
    assert unreachable(httpx.ConnectError("refused"))
    assert unreachable(httpx.ReadTimeout("slow"))
    assert not unreachable(ValueError("a bug"))
    request = httpx.Request("GET", "http://127.0.0.1/api/flow_runs/x")
    for code, verdict in ((503, True), (502, True), (429, True), (404, False), (422, False)):
        response = httpx.Response(code, request=request)
        error = PrefectHTTPStatusError.from_httpx_error(httpx.HTTPStatusError("", request=request, response=response))
        assert unreachable(error) is verdict, code


def test_the_outage_is_reported_once_and_fails_only_past_its_limit(caplog: pytest.LogCaptureFixture) -> None:
    outage = ApiOutage(0.2, "the nodes go on")
    down = httpx.ConnectError("[Errno 111] Connection refused")
    outage.failed(down)
    outage.failed(down)
    assert len(caplog.records) == 1 and "does not answer" in caplog.records[0].getMessage()  # one line, not one a poll
    outage.answered()  # back: the count starts again
    outage.failed(down)
    time.sleep(0.3)
    with pytest.raises(RetryableError) as raised:
        outage.failed(down)
    assert raised.value.exit_code == EXIT_RETRYABLE
    line = str(raised.value)
    assert "\n" not in line and "has not answered for" in line and "launch.api_outage_s" in line, line


def test_while_the_api_is_away_the_follow_loop_waits_without_retries(tmp_path: Path) -> None:
    """Even a node that recorded its end is not taken as ended while the API is away: the pipeline's own engine needs
    the API to go on, so the phase ends once it is back."""
    run = Location(str(tmp_path / "run"))
    record(run, 0, phase="train", exit_code=0)
    with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{free_port()}/api"}):
        outage = ApiOutage(60, "the nodes go on")
        with fail_fast(), get_client(sync_client=True) as client:
            assert PREFECT_CLIENT_MAX_RETRIES.value() == 0  # Prefect's own retries back off for about a minute
            assert [NodeFlowRun(r, uuid.uuid4(), client, run, "train", outage).returncode() for r in (0, 1)] == [
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
    assert [recorded_end(run, rank, "train") for rank in range(4)] == [0, 0, 2, None]
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
            runs.append(NodeFlowRun(rank, flow_run.id, client, run, "train", outage))
        assert [r.returncode() for r in runs] == [0, 0, 1, None]
        after = [client.read_flow_run(r.run_id).state for r in runs]
    assert [s.name if s else None for s in after] == ["Completed", "Completed", "Failed", "Running"]
    for corrected in after[:2]:
        assert corrected is not None and "could not report its end" in (corrected.message or ""), corrected


@flow(name="outage-probe")
def outage_probe() -> None:
    """Only its flow runs are made (their states set by the test), never run."""
