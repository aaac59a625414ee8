"""What every config section shares (config/sections/base.py): unknown keys refused, and credentials refused with one
line that names the key and the place they belong, never echoing their value."""

from __future__ import annotations

import pytest

from config.loader import load_config
from core.errors import UserError

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
