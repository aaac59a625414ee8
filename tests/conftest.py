"""Shared fixtures (see tests/README.md). Local state goes to a per-session temporary folder, never the user's
~/.prefect."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.command import free_port
from storage.location import Location
from tests.servers import MlflowServer, PrefectServer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".tandem" / "torch_extensions"))
# One thread per process: every rank, CLI and this process. Without it 2 ranks on 2 cores fight over 2x2
# OpenMP threads and tiny steps take 10x longer.
os.environ.setdefault("OMP_NUM_THREADS", "1")


WARM_SITE = ROOT / "tests" / "warm" / "site"
# The marked suites that look at processes from the outside (their /proc entries, their memory) start them cold.
COLD_SUITES = ("cold_start", "orphans", "netns", "published", "cancel")


@pytest.fixture(scope="session", autouse=True)
def warm_start(tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen | None]:
    """Torchrun agents and ranks started by this session's tests fork from a warm interpreter (tests/warm/zygote.py):
    started now in the background, it takes the processes that ask once it listens (before, they start cold).
    TANDEM_COLD_START=1 turns it off for a session, the marker `cold_start` (and the COLD_SUITES) for a test. Yields
    the zygote's process (None when off)."""
    from launch.command import MALLOC_MMAP_THRESHOLD

    if os.environ.get("TANDEM_COLD_START") == "1":
        yield None
        return
    socket_path = tmp_path_factory.getbasetemp() / "warm.sock"
    env = {key: value for key, value in os.environ.items() if key != "TANDEM_WARM_SOCKET"}
    env |= {"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TANDEM_RANK_PROCESS": "1"}
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(MALLOC_MMAP_THRESHOLD))  # what launch/command.py gives a rank
    log = open(tmp_path_factory.getbasetemp() / "warm.log", "w")  # noqa: SIM115 - closed at the session's end
    zygote = subprocess.Popen(
        [sys.executable, "-m", "tests.warm.zygote", str(socket_path)], cwd=ROOT, env=env, stdout=log, stderr=log
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TANDEM_WARM_SOCKET", str(socket_path))
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(WARM_SITE), os.environ.get("PYTHONPATH")])))
        yield zygote
    zygote.terminate()
    zygote.wait(timeout=30)
    log.close()


@pytest.fixture(autouse=True)
def cold_start(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked `cold_start`, or of a suite that looks at processes from the outside, starts them cold."""
    if any(request.node.get_closest_marker(name) for name in COLD_SUITES):
        monkeypatch.delenv("TANDEM_WARM_SOCKET", raising=False)


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[PrefectServer]:
    """One real Prefect server (Prefect's test harness) for the whole session; every test that needs a server
    shares it, except the deployment tests, which need the UI (tests/deploy/conftest.py).

    From the first test that asks for it to the end of the session, this process's client and every child
    (CLIs, workers) talk to it: PREFECT_API_URL is set in the environment. A test of Prefect's temporary
    server removes that variable from its child's environment (`run_cli(..., env={"PREFECT_API_URL": None})`).

    Why not one `prefect server start` for everything: with its SQLite database and the background services it
    runs, five workers' heartbeats held the database locked for 60 s at a time (a node flow run waited a minute
    to start); the harness's server runs without them.
    """
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    from tests.servers import client_env

    logs = ROOT / ".tandem" / "test-prefect"
    logs.mkdir(parents=True, exist_ok=True)
    with (
        prefect_test_harness(server_startup_timeout=120),
        temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
        pytest.MonkeyPatch.context() as patch,
    ):
        api_url = str(PREFECT_API_URL.value())
        patch.setenv("PREFECT_API_URL", api_url)
        # Its SQLite answers 500 "database is locked" now and then on a loaded machine (seen in CI, a pipeline's
        # cancel then failed): every client here retries that as Prefect retries a 503 (tests/servers.py likewise).
        patch.setenv("PREFECT_CLIENT_RETRY_EXTRA_CODES", "500")
        yield PrefectServer(api_url, None, client_env(api_url), logs)


@pytest.fixture(scope="session", autouse=True)
def session_node_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every node's cache (launch.node_cache_dir unset: TANDEM_NODE_CACHE, inherited by nodes and ranks) in a folder
    of the session, not the user's ~/.cache/tandem: the digests and dataset copies tests make stay theirs."""
    folder = tmp_path_factory.mktemp("node-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TANDEM_NODE_CACHE", str(folder))
        yield folder


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3 HTTP endpoint (moto's server) on 127.0.0.1 for the whole session; yields its URL.

    This process gets fake AWS credentials and region (AWS_ACCESS_KEY_ID/SECRET, AWS_DEFAULT_REGION=us-east-1);
    clients reach the endpoint through fsspec options ({"endpoint_url": url}) or AWS_ENDPOINT_URL in a child's
    environment. moto keeps objects in memory.
    """
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ACCESS_KEY_ID", "testing")
        patch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            patch.delenv(name, raising=False)
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """One real `mlflow server` on 127.0.0.1 for the whole session (SQLite backend store, artifacts on local disk,
    served through the server); tests reach it through MLflow's client on `mlflow_server.uri`."""
    from tests.servers import start_mlflow_server, stop

    server, process = start_mlflow_server(tmp_path_factory.mktemp("mlflow"), free_port())
    try:
        yield server
    finally:
        stop(process)


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> Location:
    """A new empty bucket on the session's S3 endpoint: the location `s3://name` with the endpoint as its fsspec
    option (what a config's run.storage_options would give)."""
    from storage.fs import filesystem
    from storage.location import Location

    bucket = Location(f"s3://tandem-test-{uuid.uuid4().hex[:12]}", {"endpoint_url": s3_endpoint})
    fs, path = filesystem(bucket)
    fs.mkdir(path)
    return bucket


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """The built-in tiny model (random Qwen2 + a tokenizer trained on the sample), built as the pipeline builds it:
    once for every worker and every session of this checkout, under its recipe's digest (pipeline/models.py
    `tiny_model_url`: a change to its code or corpus builds a new one) in .tandem/test-models/, the first worker to
    ask building it while the others wait. Tests read it, never write to it."""
    import fcntl
    import shutil
    import subprocess

    from pipeline.models import TINY_CORPUS, tiny_model_url
    from storage.location import local_path

    cache = ROOT / ".tandem" / "test-models"
    cache.mkdir(parents=True, exist_ok=True)
    out = Path(local_path(tiny_model_url(Location(str(cache)))))
    with open(cache / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "COMPLETE").exists():
            for stale in out.parent.glob("tiny-*"):  # another recipe's: the cache holds one model
                shutil.rmtree(stale, ignore_errors=True)
            command = [sys.executable, "-m", "trainer.model.tiny", "--out", str(out), "--corpus", str(TINY_CORPUS)]
            subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    return str(out)


@pytest.fixture(scope="session")
def published_tiny(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model laid out as Qwen publishes Qwen2.5-0.5B-Instruct (tests/published.py): tied embeddings, no
    pad_token_id in config.json, bf16 weights, generation_config.json; the tiny tokenizer's files, so data staged for
    `tiny_model` trains it."""
    from tests.published import tiny_as_published

    # Named as a hub repository is (mixed case): the run registers under its lowercased name.
    return str(tiny_as_published(tiny_model, tmp_path_factory.mktemp("published") / "Tiny-Qwen2.5-Instruct"))


@pytest.fixture(scope="session")
def published_tiny_sharded(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """published_tiny in shards of 200 kB with model.safetensors.index.json, as larger models are published."""
    from tests.published import tiny_as_published

    return str(tiny_as_published(tiny_model, tmp_path_factory.mktemp("published") / "tiny", max_shard_size="200KB"))


@pytest.fixture(scope="session")
def qwen3_moe(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Qwen3-30B-A3B as published (its config keys and values, sharded safetensors with an index, Qwen3's tokenizer)
    with its sizes scaled down to 2 layers of 8 experts (tests/published.py)."""
    from tests.published import qwen3_moe_scaled

    return str(qwen3_moe_scaled(tmp_path_factory.mktemp("published") / "Qwen3-30B-A3B-scaled"))


@pytest.fixture(scope="session")
def qwen25_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tokenizer of the built-in tiny-qwen2.5 model (Qwen's BPE, Qwen2.5's tokens and template), saved as the
    model build saves it; no model weights (the template and masking tests need none)."""
    from trainer.model.tiny_qwen import build_qwen25_tokenizer

    out = tmp_path_factory.mktemp("qwen25") / "tokenizer"
    build_qwen25_tokenizer().save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session", params=["tiny", "tiny-qwen2.5"])
def builtin_tokenizer(request: pytest.FixtureRequest) -> str:
    """Each built-in model's tokenizer directory in turn: tiny's small BPE, then Qwen's real one."""
    return request.getfixturevalue("tiny_model" if request.param == "tiny" else "qwen25_tokenizer")


def run_cli(*args: str, cwd: Path = ROOT, env: dict[str, str | None] | None = None, timeout: int = 600):
    """Run `python -m ...` as a user would; returns the CompletedProcess. `env` adds to this process's
    environment; a None value removes the variable."""
    import subprocess

    full_env = {**os.environ, **(env or {})}
    full_env = {key: value for key, value in full_env.items() if value is not None}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="session")
def qwen25_vl(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Qwen2.5-VL-3B-Instruct laid out as published (tests/published_vision.py: every key of its config.json, its
    processor files, sharded bf16 safetensors), its sizes scaled down and the tiny model's tokenizer (Qwen2.5's vision
    tokens among its own)."""
    from tests.published_vision import QWEN25_VL_3B_INSTRUCT, write_vision_published

    out = tmp_path_factory.mktemp("published") / "Qwen2.5-VL-3B-Instruct-scaled"
    return str(write_vision_published(out, Path(tiny_model), QWEN25_VL_3B_INSTRUCT))


@pytest.fixture(scope="session")
def qwen3_vl(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Qwen3-VL-4B-Instruct laid out as published (its language model's keys under text_config, deepstack mergers),
    scaled down as qwen25_vl is."""
    from tests.published_vision import QWEN3_VL_4B_INSTRUCT, write_vision_published

    out = tmp_path_factory.mktemp("published") / "Qwen3-VL-4B-Instruct-scaled"
    return str(write_vision_published(out, Path(tiny_model), QWEN3_VL_4B_INSTRUCT))


@pytest.fixture(scope="session")
def staged(tmp_path_factory, tiny_model):
    """The session's tiny model and the sample data, staged once for every test that runs real ranks."""
    from tests.distributed.harness import stage

    return stage(tmp_path_factory.mktemp("dist-storage"), tiny_model)


@pytest.fixture
def s3_stoppable(s3_endpoint: str) -> Iterator:
    """An S3 endpoint of its own (moto's server) that a test may stop and start again on the same port, with a
    new bucket on it: yields (StoppableEndpoint, the bucket's location). Objects survive a stop."""
    from storage.fs import filesystem
    from storage.location import Location
    from tests.s3_faults import StoppableEndpoint

    endpoint = StoppableEndpoint(free_port())
    endpoint.start()
    bucket = Location(f"s3://tandem-fault-{uuid.uuid4().hex[:12]}", {"endpoint_url": endpoint.url})
    fs, path = filesystem(bucket)
    fs.mkdir(path)
    try:
        yield endpoint, bucket
    finally:
        endpoint.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With TANDEM_CPU_REPORT=FILE, each test's wall time and CPU seconds (its process and every process below it) go
    to FILE (tests/cpu_report.py)."""
    path = os.environ.get("TANDEM_CPU_REPORT")
    if not path:
        yield
        return
    import time

    from tests.cpu_report import Recorder, cpu_now

    started = (time.perf_counter(), cpu_now())
    yield
    Recorder(path).measure(item.nodeid, started)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: absent under `-p no:xdist`
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadscope` (what `make test` asks for) groups and orders work as tests/scheduling.py says."""
    if config.getvalue("dist") == "loadscope":
        from tests.scheduling import SuiteScheduling

        return SuiteScheduling(config, log)
    return None
