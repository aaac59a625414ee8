"""Storage retries against a real S3 endpoint (moto's server on 127.0.0.1) that is really stopped and started:
a transient outage costs a pause, a permanent one fails with one line that names the endpoint, and exclusive
creates stay exactly-once when an answer is lost on the wire."""

from __future__ import annotations

import logging
import threading

import pytest

from core.errors import EXIT_RETRYABLE, UserError
from storage.conditional import create_exclusive
from storage.fs import read_bytes, write_bytes_atomic
from storage.location import Location, join
from storage.retry import RETRY_ENV, StorageUnavailable, is_transient, retry_budget
from tests.s3_faults import LoseOneAnswer

# botocore and s3fs retry connection errors themselves for about 8 s; one attempt each leaves the retries
# under test to storage/fs.py alone.
ONE_ATTEMPT = {"config_kwargs": {"retries": {"max_attempts": 1}}}


class RestartOnFirstRetry(logging.Handler):
    """Starts a stopped endpoint again, in the background, when storage/fs.py logs its first retry."""

    def __init__(self, endpoint) -> None:
        super().__init__(logging.WARNING)
        self.endpoint, self.started = endpoint, False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.started and "retry" in record.getMessage():
            self.started = True
            threading.Thread(target=self.endpoint.start, daemon=True).start()


def retries_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "storage.retry" and "retry" in r.getMessage()]


def test_an_outage_is_retried_and_the_write_lands_whole(s3_stoppable, monkeypatch, caplog) -> None:
    endpoint, bucket = s3_stoppable
    monkeypatch.setenv(RETRY_ENV, "30")
    url = Location(f"{bucket}/runs/r/metrics.jsonl", {"endpoint_url": endpoint.url, **ONE_ATTEMPT})
    body = b"x" * 100_000
    endpoint.stop()
    # The endpoint comes back once the first failed attempt is logged (not after a fixed time: on a loaded machine
    # the write could start after it, and meet no outage at all).
    restart = RestartOnFirstRetry(endpoint)
    logging.getLogger("storage.retry").addHandler(restart)
    try:
        with caplog.at_level(logging.WARNING, logger="storage.retry"):
            write_bytes_atomic(url, body)
    finally:
        logging.getLogger("storage.retry").removeHandler(restart)
    assert read_bytes(url) == body
    logged = retries_logged(caplog)
    assert logged and all(f"write {url} failed" in line and RETRY_ENV in line for line in logged)


def test_a_permanent_outage_fails_with_one_line_naming_the_endpoint(s3_stoppable, monkeypatch) -> None:
    endpoint, bucket = s3_stoppable
    url = Location(f"{bucket}/datasets/d/manifest.json", {"endpoint_url": endpoint.url, **ONE_ATTEMPT})
    write_bytes_atomic(url, b"{}")
    monkeypatch.setenv(RETRY_ENV, "1.5")
    endpoint.stop()
    with pytest.raises(StorageUnavailable) as info:
        read_bytes(url)
    message = str(info.value)
    assert "\n" not in message and info.value.exit_code == EXIT_RETRYABLE
    assert message.startswith(f"{url}: storage unreachable (read: EndpointConnectionError")
    assert f"is the endpoint at {endpoint.url} up? check AWS_ENDPOINT_URL" in message


def test_what_a_retry_cannot_change_is_raised_at_once(s3_stoppable, monkeypatch, caplog) -> None:
    _, bucket = s3_stoppable
    monkeypatch.setenv(RETRY_ENV, "30")
    with caplog.at_level(logging.WARNING, logger="storage.retry"), pytest.raises(FileNotFoundError):
        read_bytes(join(bucket, "no/such/object"))
    assert not retries_logged(caplog)
    assert not is_transient(PermissionError(13, "denied")) and is_transient(ConnectionRefusedError(111, "refused"))


def test_an_exclusive_create_whose_answer_was_lost_is_still_ours(s3_stoppable) -> None:
    endpoint, bucket = s3_stoppable
    proxy = LoseOneAnswer(endpoint.port, lambda head: head.startswith(b"PUT ") and b"if-none-match" in head.lower())
    try:
        url = Location(f"{bucket}/registry/m/v0001.json", {"endpoint_url": proxy.url})
        assert create_exclusive(url, b'{"writer": "a"}')  # the PUT landed; its answer did not
        assert proxy.lost, "the proxy never dropped an answer: the test did not test anything"
        assert read_bytes(url) == b'{"writer": "a"}'
        assert not create_exclusive(url, b'{"writer": "b"}')  # somebody else's claim still loses
    finally:
        proxy.close()


def test_the_retry_budget_is_validated(monkeypatch) -> None:
    monkeypatch.setenv(RETRY_ENV, "soon")
    with pytest.raises(UserError, match=rf"^{RETRY_ENV}='soon': expected a number of seconds"):
        retry_budget()
    monkeypatch.setenv(RETRY_ENV, "0")
    assert retry_budget() == 0
