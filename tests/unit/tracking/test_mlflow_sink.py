"""The MLflow sink against MLflow itself (its client on a SQLite store: the same client and store code a tracking
server runs, without the HTTP hop): one MLflow run per Tandem run, found again by a retry, which resumes after the
last step it holds; a server that cannot be reached is one line before training."""

from __future__ import annotations

import pytest

from core.errors import UserError
from launch.command import free_port
from storage.location import Location
from tracking.mlflow_sink import RUN_TAG, MlflowSink, check_server, make_client, run_link
from tracking.sink import RunInfo

STEPS = [{"step": s, "loss": 3.0 - s / 10, "lr": 1e-4, "tokens_per_s": 100.0} for s in (1, 2, 3)]


@pytest.fixture
def uri(tmp_path, monkeypatch) -> str:
    for key in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(key, raising=False)  # make_client sets them where unset: keep them to this test
    monkeypatch.chdir(tmp_path)  # a SQLite store keeps its artifacts beside the working directory
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_a_run_is_recorded_and_a_retry_finds_it_and_resumes_after_its_last_step(uri, tmp_path) -> None:
    run = RunInfo("run-7", Location(str(tmp_path / "runs" / "run-7")), "flow-1", None)
    card = tmp_path / "model_card.md"
    card.write_text("# the card")
    sink = MlflowSink(uri, "tandem-tests")
    assert sink.open(run) == 0
    sink.log_params({"train.learning_rate": "0.0003", "train.note": "x" * 7000})
    sink.log_steps(STEPS[:2])
    sink.log_metrics({"eval/loss": 2.5}, 2)
    sink.set_tags({"tandem.spec_digest": "abc"})
    sink.log_file(Location(str(card)), "model_card.md")
    sink.close("FAILED")

    retry = MlflowSink(uri, "tandem-tests")
    assert retry.open(run) == 2 and retry.mlflow_run_id == sink.mlflow_run_id
    retry.log_params({"train.learning_rate": "0.1"})  # a rerun keeps the first value (MLflow refuses to change it)
    retry.log_steps(STEPS[2:])
    retry.close("FINISHED")

    client = make_client(uri)
    recorded = client.get_run(sink.mlflow_run_id)
    assert recorded.info.status == "FINISHED" and recorded.data.tags[RUN_TAG] == "run-7"
    assert recorded.data.tags["prefect.flow_run_id"] == "flow-1" and recorded.data.tags["tandem.spec_digest"] == "abc"
    assert recorded.data.params["train.learning_rate"] == "0.0003"
    assert len(recorded.data.params["train.note"]) == 6000 and recorded.data.params["train.note"].endswith("...")
    assert [m.step for m in client.get_metric_history(sink.mlflow_run_id, "train/loss")] == [1, 2, 3]
    assert [m.value for m in client.get_metric_history(sink.mlflow_run_id, "eval/loss")] == [2.5]
    assert [a.path for a in client.list_artifacts(sink.mlflow_run_id)] == ["model_card.md"]
    assert sink.link is None  # a local store has no UI page


def test_a_server_that_cannot_be_reached_is_one_line_with_the_fix() -> None:
    uri = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(UserError) as info:
        check_server(uri)
    message = str(info.value)
    assert message.startswith(f"track.mlflow_uri: MLflow at {uri} is not reachable (") and "\n" not in message
    assert "set track.mlflow_uri=off to train without MLflow" in message
    check_server("sqlite:///nowhere.db")  # a local store: nothing to reach beforehand
    assert run_link("http://mlflow:5000/", "3", "abc") == "http://mlflow:5000/#/experiments/3/runs/abc"
