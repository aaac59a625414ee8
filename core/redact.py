"""What counts as a secret, and masking it wherever text or documents leave a process (logs, the model card,
registry entries, Prefect artifacts).

Credentials never belong in the config: the loader refuses a secret-looking `launch.env` key or storage option
(`refuse_secret_keys`), and nodes get credentials by name through `launch.forward_env`. Masking is the second line
of defence for what could still slip through: a value under a secret-looking name, a URL's password, or the value
of a secret-looking variable of this process's environment quoted in a message or a traceback.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"
# A name is secret-looking when one of its words (split at _ - . and camelCase) is, or ends in, one of these:
# HF_TOKEN, AWS_SECRET_ACCESS_KEY, apiKey, sas_token, db_password. Whole words, so that TOKENIZERS_PARALLELISM
# or `tokenizer` are not; `token_accuracy` is, which is why documents are masked only where the value is a string.
_SECRET_WORD = re.compile(r"^(\w*(KEY|SECRET|TOKEN|PASSWORD|PASSWD|PASSPHRASE|CREDENTIALS?)|AUTH(ORIZATION)?|SECRETS)$")
# ...unless its last word says it names a place: AWS_SHARED_CREDENTIALS_FILE, SSH_KEY_PATH hold paths, not secrets.
_LOCATION_WORD = re.compile(r"^(FILE|PATH|DIR|DIRECTORY)$")
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z0-9]+(?![a-z])")
# `NAME=value`, `name: value`, `"name": "value"`: the name and separator, then the value (quoted, or up to a
# separator). Only the name and separator are consumed while scanning, so `env: HF_TOKEN=x` finds HF_TOKEN.
_NAME_SEP = re.compile(r"""(?P<name>[A-Za-z_][\w.-]*)(?P<sep>["']?\s*[=:]\s*)""")
_VALUE = re.compile(r""""[^"]*"|'[^']*'|[^\s,;'"}\])]+""")
_NUMBER = re.compile(r"^[-+]?\d[\d_]*(\.\d+)?([eE][-+]?\d+)?$")
# After a colon, a lower-case word is prose, not a value: an error about a field names it as `train.api_key: unknown
# key` or `track.wandb_key: expected a string`. Generated credentials mix case or digits; `=` assignments are masked
# whatever their value.
_PROSE_WORD = re.compile(r"^[a-z]+$")
# Not a value but a stand-in: a placeholder or a variable's name (`KEY=VALUE`, `TOKEN=HF_TOKEN`), a shell reference.
_PLACEHOLDER = re.compile(r"^([A-Z][A-Z_]*|\$\{?\w+\}?|\.\.\.|…|\*\*\*)$")
# scheme://user:password@host: the password.
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/\s:@]*:)(?P<password>[^@\s/]+)(?=@)", re.IGNORECASE)
# Shorter environment values are masked by name only: masking a short word ("tandem", "testing") everywhere it occurs
# would garble the logs. Generated credentials (cloud keys, API tokens, the cluster's auth string) are longer.
MIN_LITERAL = 12


def is_secret_name(name: str) -> bool:
    """Whether a variable, option or field name looks like it holds a credential."""
    words = [word.upper() for word in _WORDS.findall(name)]
    return bool(words) and not _LOCATION_WORD.match(words[-1]) and any(_SECRET_WORD.match(w) for w in words)


def secret_keys(options: Mapping[str, Any], prefix: str) -> list[str]:
    """The dotted keys of secret-looking entries in a (nested) mapping: `run.storage_options.client_kwargs.secret`."""
    found = []
    for key, value in options.items():
        dotted = f"{prefix}.{key}" if str(key).isprintable() else f"{prefix}.{str(key)!r}"  # one line, always
        if is_secret_name(str(key)):
            found.append(dotted)
        elif isinstance(value, Mapping):
            found += secret_keys(value, dotted)
    return found


def has_url_password(text: str) -> bool:
    """Whether a string holds a URL with a password (scheme://user:password@host)."""
    return bool(_URL_PASSWORD.search(text))


def secret_environment(environ: Mapping[str, str] | None = None, names: Iterable[str] = ()) -> list[str]:
    """Values worth masking literally: those of secret-looking variables of an environment, and of `names`."""
    env = os.environ if environ is None else environ
    wanted = {name for name in env if is_secret_name(name)} | set(names)
    return sorted({env[n] for n in wanted if len(env.get(n, "")) >= MIN_LITERAL}, key=len, reverse=True)


def mask_text(text: str, literals: Iterable[str] = ()) -> str:
    """`text` with the values of secret-looking assignments, URL passwords and the given literals masked."""
    for literal in literals:
        text = text.replace(literal, MASK)

    pieces, done = [], 0
    for match in _NAME_SEP.finditer(text):
        if match.start() < done or not is_secret_name(match["name"]):
            continue
        value = _VALUE.match(text, match.end())
        if value is None:
            continue
        bare = value[0].strip("'\"")
        if not bare or _NUMBER.match(bare) or _PLACEHOLDER.match(bare):
            continue
        if ":" in match["sep"] and value[0] == bare and _PROSE_WORD.match(bare):
            continue
        quote = value[0][0] if value[0][0] in "'\"" else ""
        pieces += [text[done : match.end()], f"{quote}{MASK}{quote}"]
        done = value.end()
    text = "".join(pieces) + text[done:]
    return _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}", text)


def redact(document: Any) -> Any:
    """A copy of a JSON-like document with every string under a secret-looking key masked, and URL passwords in
    other strings masked. Only strings: numbers under names such as `token_accuracy` are metrics, not secrets."""
    if isinstance(document, Mapping):
        return {
            key: MASK if is_secret_name(str(key)) and isinstance(value, str) and value else redact(value)
            for key, value in document.items()
        }
    if isinstance(document, list | tuple):
        return [redact(item) for item in document]
    if isinstance(document, str):
        return _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}", document)
    return document


class MaskingFilter(logging.Filter):
    """Masks secrets in every record a handler emits: the message (arguments merged in) and its traceback."""

    def __init__(self, literals: Iterable[str] = ()) -> None:
        super().__init__()
        self.literals = list(literals)

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record in place; never drops one."""
        message = record.getMessage()
        masked = mask_text(message, self.literals)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = mask_text(record.exc_text, self.literals)
        return True


def install_log_masking(names: Iterable[str] = ()) -> None:
    """Put a MaskingFilter on every handler of every logger there is now (the root's, Prefect's API and console
    handlers, a rank's stream), masking the values of this process's secret-looking variables and of `names`.
    Installing again refreshes the values and adds no second filter."""
    literals = secret_environment(names=names)
    loggers = [logging.getLogger()] + [
        logger for logger in logging.Logger.manager.loggerDict.values() if isinstance(logger, logging.Logger)
    ]
    for logger in loggers:
        for handler in logger.handlers:
            existing = next((f for f in handler.filters if isinstance(f, MaskingFilter)), None)
            if existing is None:
                handler.addFilter(MaskingFilter(literals))
            else:
                existing.literals = literals
