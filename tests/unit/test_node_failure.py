"""A failed node is classified by its exit code, also when the pipeline follows it from elsewhere (the `prefect`
backend reads what the node recorded in its status.json), never by the text of its message."""

from __future__ import annotations

import json

from config.errors import EXIT_RETRYABLE, EXIT_USER_ERROR, RetryableError, UserError
from launch.diagnose import error_for
from launch.node import clear_failure, failure_exit_code, record_failure
from storage import layout


def test_the_exit_code_decides_whether_a_retry_may_help() -> None:
    assert isinstance(error_for(EXIT_USER_ERROR, "UserError in the text changes nothing"), UserError)
    assert isinstance(error_for(EXIT_RETRYABLE, "bad config"), RetryableError)
    assert isinstance(error_for(None, "no code known"), RetryableError)


def test_a_node_records_its_failure_next_to_its_status_and_a_new_attempt_forgets_it(tmp_path) -> None:
    run = str(tmp_path / "runs" / "r")
    assert failure_exit_code(run, 1) is None
    status = tmp_path / "runs" / "r" / "nodes" / "1" / layout.STATUS
    status.parent.mkdir(parents=True)
    status.write_text(json.dumps({"node_rank": 1, "phase": "train", "exit_code": 1, "host": "h"}))
    record_failure(run, 1, "train", EXIT_USER_ERROR)
    assert failure_exit_code(run, 1) == EXIT_USER_ERROR
    assert json.loads(status.read_text())["host"] == "h"  # what the agent wrote is kept
    clear_failure(run, 1)
    assert failure_exit_code(run, 1) is None
    assert json.loads(status.read_text()) == {"node_rank": 1, "phase": "train", "exit_code": 1, "host": "h"}


def test_a_node_that_failed_before_its_agent_ran_still_records_why(tmp_path) -> None:
    run = str(tmp_path / "runs" / "r")
    record_failure(run, 0, "train", EXIT_USER_ERROR)  # e.g. its preflight refused the node
    assert failure_exit_code(run, 0) == EXIT_USER_ERROR
