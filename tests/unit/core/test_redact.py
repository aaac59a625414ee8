"""What counts as a secret and how it is masked: names that look like credentials, values under them, passwords in
URLs and known literals, in text, in documents (registry entries, params) and in log records with their tracebacks."""

from __future__ import annotations

import io
import logging

import pytest

from core.redact import MASK, MaskingFilter, is_secret_name, mask_text, redact

CANARY = "canary-7f3a9c2e51d04b68"


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
