"""Credentials: refused in the config with one line that never echoes them, forwarded by name (launch.forward_env),
reported "set"/"missing" by preflight, and masked as *** in logs, registry entries and documents. Plain functions and
real files; the whole pipeline with a canary value is tests/secrets/test_canary.py (marker `secrets`)."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from config.loader import load_config
from config.sections.launch import LaunchConfig
from core.errors import UserError
from core.redact import MASK, MaskingFilter, is_secret_name, mask_text, redact
from launch.backends.slurm import sbatch_command
from launch.command import rank_environment
from launch.forward import check_forwarded, forward_env, forwarded_report
from storage.location import Location
from storage.registry import read_entry, register_version
from tests.conftest import ROOT
from tests.registry_helpers import entry

CANARY = "canary-7f3a9c2e51d04b68"


@pytest.mark.parametrize(
    ("override", "key", "fix"),
    [
        (
            f"launch.env={{AWS_SECRET_ACCESS_KEY: {CANARY}, NCCL_DEBUG: INFO}}",
            "launch.env.AWS_SECRET_ACCESS_KEY",
            "launch.forward_env",
        ),
        (f"launch.env.HF_TOKEN={CANARY}", "launch.env.HF_TOKEN", "launch.forward_env"),
        (f"launch.env.wandbApiKey={CANARY}", "launch.env.wandbApiKey", "launch.forward_env"),
        (
            f"run.storage_options={{endpoint_url: 'http://h:9000', secret: {CANARY}}}",
            "run.storage_options.secret",
            "AWS_PROFILE",
        ),
        (f"run.storage_options.key={CANARY}", "run.storage_options.key", "AWS_ACCESS_KEY_ID"),
        (f"data.storage_options.token={CANARY}", "data.storage_options.token", "AWS_PROFILE"),
        (
            f"data.storage_options.client_kwargs={{aws_secret_access_key: {CANARY}}}",
            "data.storage_options.client_kwargs.aws_secret_access_key",
            "AWS_PROFILE",
        ),
        (f"run.storage_options={{password: {CANARY}}}", "run.storage_options.password", "AWS_PROFILE"),
    ],
)
def test_secret_looking_config_is_refused_naming_the_key_without_its_value(override: str, key: str, fix: str) -> None:
    with pytest.raises(UserError) as caught:
        load_config(None, [override])
    message = str(caught.value)
    assert f"{key} looks like a credential" in message and fix in message
    assert CANARY not in message and "\n" not in message


@pytest.mark.parametrize(
    "override",
    [
        f"data.source=https://u:{CANARY}@example.com/d.jsonl",
        f"data.eval_source=https://u:{CANARY}@example.com/e.jsonl",
        f"run.storage=s3://u:{CANARY}@bucket/tandem",
        f"data.sources[1].source=https://u:{CANARY}@example.com/d.jsonl",
    ],
)
def test_a_url_with_a_password_is_refused_naming_the_key(override: str) -> None:
    key, value = override.split("=", 1)
    if key.startswith("data.sources"):  # a list: set as a whole
        override = f"data.sources=[{{source: a.jsonl}}, {{source: '{value}'}}]"
    with pytest.raises(UserError) as caught:
        load_config(None, [override])
    assert f"{key} has a password in its URL: remove it and give credentials through the environment" in str(
        caught.value
    )
    assert CANARY not in str(caught.value)


def test_a_wrongly_typed_value_under_launch_env_is_not_echoed() -> None:
    with pytest.raises(UserError) as caught:
        load_config(None, ["launch.env.NCCL_DEBUG=[1234567890]"])
    assert "launch.env.NCCL_DEBUG" in str(caught.value) and "1234567890" not in str(caught.value)


def test_ordinary_environment_and_forwarded_names_load() -> None:
    cfg = load_config(
        None,
        [
            "launch.env={NCCL_SOCKET_IFNAME: eth0, TOKENIZERS_PARALLELISM: 'false'}",
            "launch.forward_env=[HF_TOKEN, AWS_SECRET_ACCESS_KEY]",
            "run.storage_options={endpoint_url: 'http://127.0.0.1:9000'}",
        ],
    )
    assert cfg.launch.forward_env == ["HF_TOKEN", "AWS_SECRET_ACCESS_KEY"]
    assert cfg.launch.env == {"NCCL_SOCKET_IFNAME": "eth0", "TOKENIZERS_PARALLELISM": "false"}


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["launch.forward_env=[HF_TOKEN, 9LIVES]"], "launch.forward_env: '9LIVES' is not an environment variable name"),
        (["launch.forward_env=[HF_TOKEN, HF_TOKEN]"], "launch.forward_env: HF_TOKEN is listed twice"),
        (
            ["launch.forward_env=[NCCL_DEBUG]", "launch.env.NCCL_DEBUG=INFO"],
            "launch.env.NCCL_DEBUG is also in launch.forward_env; keep it in one place",
        ),
    ],
)
def test_bad_forwarded_names_are_refused(overrides: list[str], expected: str) -> None:
    with pytest.raises(UserError, match=expected):
        load_config(None, overrides)


def test_forward_env_reads_values_by_name_and_reports_only_set_or_missing() -> None:
    launch = LaunchConfig(forward_env=["HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "EMPTY"])
    environ = {"HF_TOKEN": CANARY, "AWS_SECRET_ACCESS_KEY": "k" * 20, "EMPTY": "", "OTHER": "x"}
    assert forward_env(launch, environ) == {"HF_TOKEN": CANARY, "AWS_SECRET_ACCESS_KEY": "k" * 20}
    assert forwarded_report(launch, environ) == {"HF_TOKEN": "set", "AWS_SECRET_ACCESS_KEY": "set", "EMPTY": "missing"}
    with pytest.raises(UserError) as caught:
        check_forwarded(launch, 1, "gpu-07", environ)
    message = str(caught.value)
    assert message.startswith("node 1 (gpu-07): launch.forward_env names EMPTY, not set on this node")
    assert CANARY not in message and "\n" not in message
    both = LaunchConfig(forward_env=["HF_TOKEN"])
    assert check_forwarded(both, 0, "h", environ) == "HF_TOKEN set"
    assert check_forwarded(LaunchConfig(), 0, "h", environ) == "(launch.forward_env empty)"


def test_ranks_get_forwarded_values_and_sbatch_exports_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", CANARY)
    launch = LaunchConfig(forward_env=["HF_TOKEN"])
    assert rank_environment(launch)["HF_TOKEN"] == CANARY
    assert sbatch_command("/s/train.sbatch", launch) == ["sbatch", "--parsable", "--export=ALL", "/s/train.sbatch"]
    assert sbatch_command("/s/t", LaunchConfig()) == ["sbatch", "--parsable", "/s/t"]
    own = LaunchConfig(forward_env=["HF_TOKEN"], slurm_args=["--export=NONE"])
    assert sbatch_command("/s/t", own) == ["sbatch", "--parsable", "/s/t"]  # the user's choice stands


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("AWS_ACCESS_KEY_ID", True),
        ("apiKey", True),
        ("PREFECT_API_AUTH_STRING", True),
        ("MLFLOW_TRACKING_PASSWORD", True),
        ("sas_token", True),
        ("password", True),
        ("TOKENIZERS_PARALLELISM", False),
        ("tokenizer", False),
        ("NCCL_SOCKET_IFNAME", False),
        ("endpoint_url", False),
        ("AWS_SHARED_CREDENTIALS_FILE", False),
        ("author", False),
        ("target_tokens", False),
        ("PWD", False),
    ],
)
def test_secret_looking_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_mask_text_masks_assignments_urls_and_literals_but_not_metrics() -> None:
    text = (
        f"environment: AWS_SECRET_ACCESS_KEY=s3cr3tKEY123, HF_TOKEN={CANARY}; token_accuracy: 0.4512 "
        "{'password': 'hunter2'} db postgresql+asyncpg://prefect:pw123@127.0.0.1:5432/prefect, "
        "seen xyzzy-0123456789"
    )
    masked = mask_text(text, ["xyzzy-0123456789"])
    assert mask_text("expected KEY=VALUE; TOKEN=$HF_TOKEN") == "expected KEY=VALUE; TOKEN=$HF_TOKEN"  # stand-ins
    prose = "train.no_such_key: unknown key (allowed here: method); api_token: hunter2x"
    assert mask_text(prose) == "train.no_such_key: unknown key (allowed here: method); api_token: ***"
    assert masked == (
        "environment: AWS_SECRET_ACCESS_KEY=***, HF_TOKEN=***; token_accuracy: 0.4512 "
        "{'password': '***'} db postgresql+asyncpg://prefect:***@127.0.0.1:5432/prefect, seen ***"
    )


def test_redact_masks_strings_under_secret_names_only() -> None:
    doc = {
        "metrics": {"token_accuracy": 0.5, "target_tokens": 12},
        "env": {"HF_TOKEN": CANARY, "X": "1"},
        "source": "https://user:pw@example.com/data.jsonl",
        "items": [{"secret": CANARY}],
    }
    assert redact(doc) == {
        "metrics": {"token_accuracy": 0.5, "target_tokens": 12},
        "env": {"HF_TOKEN": MASK, "X": "1"},
        "source": "https://user:***@example.com/data.jsonl",
        "items": [{"secret": MASK}],
    }


def test_masking_filter_masks_messages_arguments_and_tracebacks() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(MaskingFilter([CANARY]))
    logger = logging.getLogger("tandem.test-secrets")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("starting with %s", f"HF_TOKEN={CANARY[::-1]}")
        try:
            raise RuntimeError(f"could not connect with {CANARY}")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert "starting with HF_TOKEN=***" in out and "RuntimeError: could not connect with ***" in out
    assert CANARY not in out and CANARY[::-1] not in out


def test_registry_entries_are_stored_masked_and_still_verify(tmp_path) -> None:
    body = {**entry(2.0, "w"), "notes": {"HF_TOKEN": CANARY}, "run_url": "s3://u:pw@bucket/runs/r"}
    version, _ = register_version(Location(str(tmp_path)), "m", body)
    raw = (tmp_path / "registry" / "m" / "v0001.json").read_text()
    assert CANARY not in raw and ":pw@" not in raw
    stored = read_entry(Location(str(tmp_path)), "m", version)  # the digest covers the masked body
    assert stored["notes"] == {"HF_TOKEN": MASK} and stored["run_url"] == "s3://u:***@bucket/runs/r"
    assert json.loads(raw)["metrics"] == body["metrics"]


def cluster_env(tmp_path, host: str, **extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    state = tmp_path / host
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")},
        "TANDEM_CLUSTER_HOST": host,
        "TANDEM_CLUSTER_DIR": str(state),
        **extra,
    }
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / "cluster.sh"), "env"], env=env, capture_output=True, text=True, timeout=30
    )
    return done, state / "prefect-auth"


def test_the_local_cluster_off_loopback_gets_a_private_auth_string(tmp_path) -> None:
    """tools/cluster.sh (make cluster-up) bound beyond 127.0.0.1 generates the Prefect API's auth string once, into a
    file only its owner can read, and tells clients how to use it without printing it. (That such a server answers
    401 without it is tests/secrets/test_canary.py.)"""
    done, auth = cluster_env(tmp_path, "192.0.2.10")
    assert done.returncode == 0, done.stderr
    secret = auth.read_text().strip()
    assert stat.S_IMODE(auth.stat().st_mode) == 0o600 and re.fullmatch(r"tandem:[A-Za-z0-9]{24,}", secret)
    # MLflow's password file is made by `up` (with the server); `env` names it, never its content.
    assert done.stdout.splitlines() == [
        "export PREFECT_API_URL=http://192.0.2.10:4200/api MLFLOW_TRACKING_URI=http://192.0.2.10:5000",
        f'export PREFECT_API_AUTH_STRING="$(cat {auth})"',
        f'export MLFLOW_TRACKING_USERNAME=tandem MLFLOW_TRACKING_PASSWORD="$(cat {auth.parent / "mlflow-password"})"',
    ]
    again, _ = cluster_env(tmp_path, "192.0.2.10")
    assert auth.read_text().strip() == secret and secret not in again.stdout  # kept, never printed
    loopback, none = cluster_env(tmp_path, "127.0.0.1")
    assert loopback.stdout.splitlines() == [
        "export PREFECT_API_URL=http://127.0.0.1:4200/api MLFLOW_TRACKING_URI=http://127.0.0.1:5000"
    ]
    assert not none.exists()
    own, unused = cluster_env(tmp_path, "192.0.2.11", PREFECT_API_AUTH_STRING="me:mine-0123456789")
    assert not unused.exists() and "mine-0123456789" not in own.stdout
