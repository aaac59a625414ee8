"""Server processes the tests start as users start them: spawned in their own session, waited for until
healthy, stopped with SIGTERM then SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

STARTUP_S = 120  # a server start takes 10-20 s on an idle machine, several times that under a loaded test run
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class PrefectServer:
    """A running `prefect server start` (API and UI)."""

    api_url: str
    ui_url: str | None  # None: the server serves no UI (Prefect's test harness)
    env: dict[str, str]  # environment for a client or worker of this server
    logs: Path  # a directory: server.log, and the logs of the workers the tests start


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start `args` in a process group of its own, appending its output to `log`."""
    with open(log, "ab") as out:
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(*processes: subprocess.Popen, grace_s: float = 20) -> None:
    """SIGTERM each process group, then SIGKILL those still there after `grace_s` (one grace for all of them)."""
    running = [p for p in processes if p.poll() is None]
    for process in running:
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in running:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def wait_healthy(api_url: str, process: subprocess.Popen, log: Path) -> None:
    """Return once `{api_url}/health` answers; raise with the log's tail if the server exits or never answers.
    (Prefect's API and MLflow's server both answer /health.)"""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{args_of(process)} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{args_of(process)} not healthy after {STARTUP_S} s:\n{log.read_text()[-3000:]}")


def args_of(process: subprocess.Popen) -> str:
    """The command a server process runs, for an error message."""
    return " ".join(str(arg) for arg in process.args[1:4]) if isinstance(process.args, list) else str(process.args)


def client_env(api_url: str, **extra: str) -> dict[str, str]:
    """The environment of a client or worker of the server at `api_url`: this process's, less its Prefect
    settings, with quick worker polling and a server's transient 500 retried."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PREFECT_")}
    env.update(
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_API_URL=api_url,
        PREFECT_WORKER_QUERY_SECONDS="1",
        PREFECT_WORKER_PREFETCH_SECONDS="1",
        # The test server's SQLite answers 500 "database is locked" when two pipelines and a worker's heartbeats
        # write at once on a loaded 2-core machine (seen in CI): a client retries it as it retries a 503.
        PREFECT_CLIENT_RETRY_EXTRA_CODES="500",
        OMP_NUM_THREADS="1",
        TANDEM_ROOT=str(ROOT),
        **extra,
    )
    return env


def start_prefect_server(
    home: Path, logs: Path, port: int, auth: str | None = None
) -> tuple[PrefectServer, subprocess.Popen]:
    """`prefect server start` on 127.0.0.1:port with its database under `home`; returns once it is healthy. With
    `auth` ("user:password"), the server requires it (Prefect's basic auth) and the returned client env carries it."""
    logs.mkdir(parents=True, exist_ok=True)
    api_url = f"http://127.0.0.1:{port}/api"
    # PREFECT_UI_API_URL: without it the UI asks the default port (4200) for its API.
    env = client_env(
        api_url,
        PREFECT_HOME=str(home),
        PREFECT_UI_API_URL=api_url,
        **({"PREFECT_API_AUTH_STRING": auth} if auth else {}),
    )
    server_env = {**env, "PREFECT_SERVER_API_AUTH_STRING": auth} if auth else env
    process = spawn(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        server_env,
        logs / "server.log",
    )
    try:
        wait_healthy(api_url, process, logs / "server.log")
    except BaseException:
        stop(process)
        raise
    return PrefectServer(api_url, f"http://127.0.0.1:{port}", env, logs), process


@dataclass(frozen=True)
class MlflowServer:
    """A running `mlflow server`: SQLite backend store, artifacts served from a local folder."""

    uri: str
    home: Path  # mlflow.db, artifacts/, server.log


def start_mlflow_server(home: Path, port: int) -> tuple[MlflowServer, subprocess.Popen]:
    """`mlflow server` on 127.0.0.1:port as a user starts it (one worker: the tests are its only clients); returns
    once it is healthy."""
    home.mkdir(parents=True, exist_ok=True)
    uri = f"http://127.0.0.1:{port}"
    # Without MLflow's job runner (GenAI scoring: about ten consumer processes that Tandem never uses).
    env = {
        **{key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")},
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    process = spawn(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{home / 'mlflow.db'}",
            "--artifacts-destination",
            str(home / "artifacts"),
        ],
        env,
        home / "server.log",
    )
    try:
        wait_healthy(uri, process, home / "server.log")
    except BaseException:
        stop(process)
        raise
    return MlflowServer(uri, home), process
