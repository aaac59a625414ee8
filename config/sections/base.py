"""What every config section shares: the `Section` base (unknown keys refused, values frozen) and the refusals that
keep credentials out of the config (a secret-looking key, a URL with a password), with the one-line fixes they name.

Here, apart from the sections, because the run, data and launch sections all refuse credentials the same way: one
definition of each check and of each fix's wording.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from core.redact import has_url_password, secret_keys

# Where credentials go instead of the config (the config is stored in spec.json, the Prefect database and logs).
ENV_FIX = (
    "set it in the environment of the launching process (each node's worker for launch.backend=prefect) and "
    "name it in launch.forward_env; the config holds names, never credentials"
)
STORAGE_FIX = (
    "give credentials through the environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, forwarded to the "
    "nodes with launch.forward_env) or a profile (AWS_PROFILE, ~/.aws/credentials), never the config"
)


def refuse_secrets(value: object, where: str, fix: str) -> object:
    """Refuse a mapping with a secret-looking key, naming the key (never its value) and where credentials go."""
    if isinstance(value, dict) and (found := secret_keys(value, where)):
        raise ValueError(f"{found[0]} looks like a credential: {fix}")
    return value


def refuse_url_password(value: object, where: str) -> object:
    """Refuse a URL that carries a password (https://user:password@host/...), naming the key, not the URL."""
    if isinstance(value, str) and has_url_password(value):
        raise ValueError(f"{where} has a password in its URL: remove it and {STORAGE_FIX}")
    return value


class Section(BaseModel):
    """Base for every config section: unknown keys are errors, values cannot change after load."""

    # hide_input_in_errors: a ValidationError's text (what Prefect logs when the UI form's parameters fail the flow's
    # validation) never quotes the refused value; the loader's own messages choose what to show (config/loader.py).
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)
