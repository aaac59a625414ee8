"""The wait through an outage of the Prefect API (launch/api_outage.py): what counts as the API not answering, and
the one line when it goes and the retryable error past its limit. The prefect backend's follow loop through an outage
is tests/unit/launch/backends/test_prefect.py; the whole story (the cluster's server stopped and restarted under a
training run) is tests/cluster/test_api_outage.py."""

from __future__ import annotations

import time

import httpx
import pytest
from prefect.exceptions import PrefectHTTPStatusError
from prefect.settings import PREFECT_CLIENT_MAX_RETRIES

from core.errors import EXIT_RETRYABLE, RetryableError
from launch.api_outage import ApiOutage, fail_fast, unreachable
from launch.node import status_url
from storage.fs import Location, write_json_atomic


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


def test_calls_fail_fast_inside_the_block_only() -> None:
    """Inside, a call raises at its first failure (Prefect's own retries back off for about a minute a call)."""
    before = PREFECT_CLIENT_MAX_RETRIES.value()
    with fail_fast():
        assert PREFECT_CLIENT_MAX_RETRIES.value() == 0
    assert PREFECT_CLIENT_MAX_RETRIES.value() == before
