"""Experiment tracking (`track`): what the e2e pipeline run left in a real MLflow server (read back through MLflow's
client) and in TensorBoard event files (read back with TensorBoard's own reader), the link from the Prefect UI, an
unreachable server stopped before training, and a tracking outage during a run that training never notices."""

from __future__ import annotations

import json
import re
import socket
import threading
from pathlib import Path

import pytest

from launch.command import free_port
from storage.location import Location
from tests.conftest import run_cli

pytestmark = pytest.mark.e2e


def step_lines(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "event" not in r]


@pytest.fixture(scope="module")
def mlflow_run(pipeline, mlflow_server):
    """The MLflow run of the e2e pipeline run, found by its run_id tag."""
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server.uri)
    experiment = client.get_experiment_by_name("e2e")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.`tandem.run_id` = 'e2e'")
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return client, runs[0]


def test_one_mlflow_run_holds_every_step_once_and_the_eval_metrics(pipeline, mlflow_run) -> None:
    _, summary = pipeline
    client, run = mlflow_run
    steps = step_lines(Path(summary["run_url"]))
    assert run.info.run_name == "e2e" and run.info.status == "FINISHED"
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "padding_fraction"):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, f"train/{key}"))
        assert history == [(r["step"], pytest.approx(r[key])) for r in steps], key
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == list(range(1, 31))
    assert run.data.metrics["eval/loss"] == pytest.approx(summary["eval"]["loss"])
    assert run.data.metrics["eval/perplexity"] == pytest.approx(summary["eval"]["perplexity"])


def test_the_mlflow_run_holds_the_resolved_config_lineage_and_files(pipeline, mlflow_run) -> None:
    storage, summary = pipeline
    client, run = mlflow_run
    spec = json.loads((Path(summary["run_url"]) / "spec.json").read_text())
    params = run.data.params
    assert params["train.learning_rate"] == str(spec["config"]["train"]["learning_rate"])
    assert params["launch.nnodes"] == "2" and params["resolved.world_size"] == "2"
    assert params["resolved.total_steps"] == "30" and params["resolved.dataset_id"] == summary["dataset_id"]
    assert params["resolved.deepspeed.zero_optimization.stage"] == "2"
    entry = json.loads((storage / "registry" / "tiny-qwen2.5-instruct" / "v0001.json").read_text())
    for key in ("dataset_manifest_digest", "spec_digest", "code_version", "checkpoint_manifest_digest"):
        assert run.data.tags[f"tandem.{key}"] == entry["lineage"][key], key
    # Cross-links: the Prefect flow run in MLflow's tags (and MLflow's run in Prefect, below).
    assert run.data.tags["prefect.flow_run_id"] == entry["lineage"]["flow_run_id"]
    assert run.data.tags["tandem.run_url"] == summary["run_url"]
    assert run.data.tags["tandem.registered"] == "tiny-qwen2.5-instruct v0001 (champion)"
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"loss.png", "model_card.md", "tiny-qwen2.5-instruct-v0001"} <= names  # (+ versions mirrored by other tests)
    card = Path(client.download_artifacts(run.info.run_id, "model_card.md")).read_text()
    assert card.startswith("# tiny-qwen2.5-instruct v0001")


def test_the_prefect_flow_run_links_to_the_mlflow_run(mlflow_run, mlflow_server) -> None:
    from tests.e2e.test_registration import read_artifact

    _, run = mlflow_run
    url = f"{mlflow_server.uri}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
    assert f"[MLflow: run e2e]({url})" in [a.data for a in read_artifact("mlflow-run")]


def test_tensorboard_events_hold_every_step(pipeline) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, summary = pipeline
    run = Path(summary["run_url"])
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    steps = step_lines(run)
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [
        (r["step"], pytest.approx(r["loss"])) for r in steps
    ]
    assert [e.step for e in events.Scalars("eval/loss")] == [30]
    assert events.Scalars("eval/loss")[0].value == pytest.approx(summary["eval"]["loss"])


def test_the_registered_version_and_champion_are_mirrored_and_load_back(
    pipeline, mlflow_run, mlflow_server, monkeypatch
) -> None:
    """Tandem's v0001 (the champion) is MLflow's version 1 of tiny-qwen2.5-instruct with its lineage, the `champion`
    alias names it, the mapping is recorded beside Tandem's entry, and the MLflow model loads back as the same LoRA
    model: its eval loss is the recorded one."""
    import mlflow.pyfunc

    from tests.e2e.test_registration import assert_reproduces_eval

    storage, summary = pipeline
    client, run = mlflow_run
    entry = json.loads((storage / "registry" / "tiny-qwen2.5-instruct" / "v0001.json").read_text())
    mirror = json.loads((storage / "registry" / "tiny-qwen2.5-instruct" / "mlflow" / "v0001.json").read_text())
    assert (mirror["status"], mirror["mlflow_version"], mirror["tracking_uri"]) == ("done", 1, mlflow_server.uri)
    version = client.get_model_version_by_alias("tiny-qwen2.5-instruct", "champion")
    assert version.version == "1" and version.run_id == run.info.run_id
    for key in ("dataset_manifest_digest", "spec_digest", "code_version", "checkpoint_manifest_digest"):
        assert version.tags[f"tandem.{key}"] == entry["lineage"][key], key
    assert version.tags["tandem.version"] == "1" and version.tags["tandem.entry_digest"] == entry["digest"]
    # The artifacts are served by the tracking server. (Not mlflow.set_tracking_uri: it exports the variable for
    # good, and every later pipeline run of this process would track to MLflow.)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    loaded = mlflow.pyfunc.load_model("models:/tiny-qwen2.5-instruct@champion")
    model = loaded.unwrap_python_model().model
    assert type(model).__name__ == "PeftModelForCausalLM"
    assert_reproduces_eval(model, summary["run_url"], entry)


def test_a_mirror_mlflow_cannot_take_stays_pending_until_sync_completes_it(pipeline, mlflow_server, tmp_path) -> None:
    """Registered while MLflow is unreachable: Tandem's registry has the version, MLflow nothing, the record beside
    the entry says pending; `python -m flows.registry sync` completes it and the alias. A later champion that is
    pending again leaves the alias on the older one only as long as MLflow is unreachable."""
    from mlflow import MlflowClient

    from storage.registry import promote, register_version
    from tracking.mlflow_registry import sync

    storage, _ = pipeline
    first = json.loads((storage / "registry" / "tiny-qwen2.5-instruct" / "v0001.json").read_text())
    body = {k: v for k, v in first.items() if k not in ("schema", "model", "version", "created_at", "digest")}
    tandem, client, down = Location(str(tmp_path)), MlflowClient(mlflow_server.uri), f"http://127.0.0.1:{free_port()}"
    mirror = tmp_path / "registry" / "mirror-test" / "mlflow"

    register_version(tandem, "mirror-test", body)
    assert promote(tandem, "mirror-test", 1, body["metrics"], "loss", "min")
    assert sync(tandem, "mirror-test", down, print) is False
    record = json.loads((mirror / "v0001.json").read_text())
    assert (record["status"], record["tracking_uri"]) == ("pending", down)
    assert client.search_registered_models("name = 'mirror-test'") == []

    done = run_cli("flows.registry", "--storage", tandem.url, "sync", "mirror-test", "--mlflow-uri", mlflow_server.uri)
    assert done.returncode == 0, done.stderr
    assert "MLflow: mirror-test v0001 registered as MLflow version 1" in done.stdout
    assert json.loads((mirror / "v0001.json").read_text())["status"] == "done"
    assert client.get_model_version_by_alias("mirror-test", "champion").version == "1"

    better = {**body, "metrics": {**body["metrics"], "loss": body["metrics"]["loss"] - 1}}
    register_version(tandem, "mirror-test", better)
    assert promote(tandem, "mirror-test", 2, better["metrics"], "loss", "min")
    assert sync(tandem, "mirror-test", down, print) is False
    assert json.loads((mirror / "v0002.json").read_text())["status"] == "pending"
    assert sync(tandem, "mirror-test", mlflow_server.uri, print) is True
    version = client.get_model_version_by_alias("mirror-test", "champion")
    assert (version.version, version.tags["tandem.version"]) == ("2", "2")
    assert [v.version for v in client.search_model_versions("name = 'mirror-test'")] == ["2", "1"]


def test_wandb_offline_run_files_hold_every_step_the_config_and_lineage(pipeline) -> None:
    from tests.wandb_records import history, records

    storage, summary = pipeline
    run = Path(summary["run_url"])
    [path] = run.glob("wandb/offline-run-*/run-e2e.wandb")
    rows = history(path)
    steps = step_lines(run)
    assert [(r["_step"], r["train/loss"]) for r in rows] == [(s["step"], pytest.approx(s["loss"])) for s in steps]
    assert rows[-1]["eval/loss"] == pytest.approx(summary["eval"]["loss"])
    config = {
        item.key: item.value_json
        for r in records(path)
        if r.WhichOneof("record_type") == "config"
        for item in r.config.update
    }
    assert json.loads(config["train.method"]) == "lora" and json.loads(config["resolved.world_size"]) == "2"
    entry = json.loads((storage / "registry" / "tiny-qwen2.5-instruct" / "v0001.json").read_text())
    summaries = {
        item.key or "/".join(item.nested_key): json.loads(item.value_json)
        for r in records(path)
        if r.WhichOneof("record_type") == "summary"
        for item in r.summary.update
    }
    assert summaries["tandem.spec_digest"] == entry["lineage"]["spec_digest"]


def test_files_reach_an_experiment_whose_artifacts_live_on_s3(
    pipeline, mlflow_server, s3_endpoint, s3_bucket, monkeypatch
) -> None:
    """MLflow with its artifact store on S3 (the experiment's artifact location on the session's S3 endpoint): the
    sink's files land in the bucket and read back through MLflow's client."""
    from mlflow import MlflowClient

    from storage.fs import filesystem
    from tracking.mlflow_sink import MlflowSink
    from tracking.sink import RunInfo, Tracker

    _, summary = pipeline
    monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", s3_endpoint)
    client = MlflowClient(mlflow_server.uri)
    client.create_experiment("on-s3", artifact_location=f"{s3_bucket}/mlflow")
    sink = MlflowSink(mlflow_server.uri, "on-s3")
    tracker = Tracker([sink], RunInfo("on-s3", Location(summary["run_url"]), None, None))
    plot = Location(str(Path(summary["run_url"]) / "loss.png"))
    tracker.call(lambda s: s.log_file(plot, "loss.png"))
    assert tracker.close("FINISHED", timeout_s=60) == []
    fs, bucket = filesystem(s3_bucket)
    [stored] = [p for p in fs.find(bucket) if p.endswith("/artifacts/loss.png")]
    assert fs.cat_file(stored) == Path(plot.url).read_bytes()
    assert Path(client.download_artifacts(sink.mlflow_run_id, "loss.png")).read_bytes() == Path(plot.url).read_bytes()


def test_an_unreachable_mlflow_server_stops_the_run_before_anything_is_written(prefect_server, tmp_path) -> None:
    uri = f"http://127.0.0.1:{free_port()}"
    done = run_cli("flows.finetune", "--set", f"run.storage={tmp_path}", "--set", f"track.mlflow_uri={uri}")
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert lines == [
        f"error: track.mlflow_uri: MLflow at {uri} is not reachable ([Errno 111] Connection refused); "
        "start it (mlflow server --host 127.0.0.1 --port 5000), fix track.mlflow_uri / "
        "MLFLOW_TRACKING_URI, or set track.mlflow_uri=off to train without MLflow"
    ]
    assert list(tmp_path.iterdir()) == []


class Forwarder:
    """A TCP port that forwards to the MLflow server only while `up`: the server as the sink sees it, going away
    and coming back. (The real server keeps running: the outage is the network path to it.)"""

    def __init__(self, target_port: int) -> None:
        self.port, self.target = free_port(), target_port
        self.listener: socket.socket | None = None

    def up(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def down(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            sink.close()


def steps(first: int, last: int, loss: float) -> list[dict]:
    return [{"step": s, "max_steps": last, "loss": loss + s, "lr": 0.001} for s in range(first, last + 1)]


def test_a_tracking_outage_is_retried_in_the_background_and_every_step_lands_once(mlflow_server) -> None:
    """The sink starts while its server is unreachable: feeding it returns at once (training goes on), the
    failures are retried; once the server is reachable again, everything queued lands, each step once. A retry of
    the run (a new tracker on the same run_id, metrics.jsonl written again from step 1 after a resume) resumes after
    the last step MLflow holds."""
    from mlflow import MlflowClient

    from tracking.mlflow_sink import MlflowSink
    from tracking.sink import RunInfo, Tracker

    path = Forwarder(int(mlflow_server.uri.rsplit(":", 1)[1]))
    run = RunInfo("outage", Location("/nowhere/runs/outage"), None, None)
    tracker = Tracker([MlflowSink(f"http://127.0.0.1:{path.port}", "outage")], run)
    tracker.steps(steps(1, 5, 10.0))
    tracker.call(lambda sink: sink.set_tags({"tandem.code_version": "abc"}))
    worker = tracker.workers[0]
    wait_for(lambda: worker.failures >= 1)
    assert worker.pending() == 6 and worker.last_step is None  # queued, nothing lost, nothing delivered
    path.up()
    assert tracker.close("FINISHED", timeout_s=120) == []

    retry = Tracker([MlflowSink(mlflow_server.uri, "outage")], run)
    retry.steps(steps(1, 8, 20.0))  # the resumed run's metrics.jsonl from the top: steps 1-5 are not sent again
    assert retry.close("FINISHED", timeout_s=60) == []
    client = MlflowClient(mlflow_server.uri)
    found = client.search_runs([client.get_experiment_by_name("outage").experiment_id])
    assert len(found) == 1 and found[0].data.tags["tandem.code_version"] == "abc"
    history = sorted((m.step, m.value) for m in client.get_metric_history(found[0].info.run_id, "train/loss"))
    assert history == [(s, 10.0 + s) for s in range(1, 6)] + [(s, 20.0 + s) for s in range(6, 9)]


def test_a_server_that_never_comes_back_leaves_the_record_incomplete_with_a_warning() -> None:
    from tracking.mlflow_sink import MlflowSink
    from tracking.sink import RunInfo, Tracker

    tracker = Tracker([MlflowSink(f"http://127.0.0.1:{free_port()}", "gone")], RunInfo("gone", "/x", None, None))
    tracker.steps(steps(1, 3, 0.0))
    [line] = tracker.close("FINISHED", timeout_s=3)  # 3 steps and the end of the run
    assert re.fullmatch(
        r"MLflow: 4 update\(s\) not delivered within 3 s \(\d+ failed attempt\(s\)\); its record of "
        r"run gone is incomplete, Tandem's files are not",
        line,
    ), line


def wait_for(condition, timeout_s: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
