"""A place on storage, `Location`: its URL and the fsspec options that reach it, the one type every storage, staging
and registry function takes. Strings become locations once, at the edge: the config (`storage/layout.py` `root`),
a URL read back from a document under a location (`Location.with_url`), and a process's command line
(`Location.parse`, the inverse of `Location.argument`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Options = Mapping[str, Any]
# What a command-line location looks like, for the errors that refuse one.
ARGUMENT_FORM = 'a URL or path, or a JSON object {"url": URL, "options": {...}}'


@dataclass(frozen=True)
class Location:
    """A place on storage: its URL (a local or NFS path, file://…, s3://…) and the fsspec options that reach it
    (endpoint, client settings; never credentials, which come from the environment or a profile: the config refuses
    secret-looking keys). The options travel with the location: `join` keeps them, str() is the URL alone, and in a
    document (spec.json) it is {"url": ..., "options": {...}}."""

    url: str
    options: Options = field(default_factory=dict, compare=False)

    def __str__(self) -> str:
        return self.url

    def with_url(self, url: str) -> Location:
        """Another URL reached with the same options (a URL read back from a document under this location)."""
        return Location(url, self.options)

    def argument(self) -> str:
        """This location as one command-line value for a process a launcher starts: the URL alone when there are no
        options, else the JSON object (the options are never credentials, so a command line may show them)."""
        if not self.options:
            return self.url
        return json.dumps({"url": self.url, "options": dict(self.options)}, sort_keys=True, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str) -> Location:
        """A location from its command-line form (`argument`): a URL or path, or the JSON object with options. A
        plain URL has no options: the environment's endpoint and profile reach it (a node started by hand)."""
        if not text.lstrip().startswith("{"):
            return cls(text)
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{text[:120]}: not valid JSON ({exc.msg}); expected {ARGUMENT_FORM}") from None
        url, options = doc.get("url"), doc.get("options", {})
        if set(doc) - {"url", "options"} or not isinstance(url, str) or not url or not isinstance(options, dict):
            raise ValueError(f"{text[:120]}: expected {ARGUMENT_FORM}")
        return cls(url, options)


def location_argument(text: str) -> Location:
    """argparse's `type=` for a location on a command line (`--spec`): a malformed one is argparse's one-line error
    (exit 2)."""
    try:
        return Location.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def join(base: Location, *parts: str) -> Location:
    """Join URL/path parts with '/' (fsspec URLs always use '/'), keeping the options."""
    out = base.url.rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}"
    return Location(out, base.options)


def is_local_url(url: str) -> bool:
    """True for plain paths and file:// URLs (local disk or an NFS mount)."""
    return "://" not in url or url.startswith("file://")


def is_local(where: Location) -> bool:
    """True for a location on a local path or file:// URL (local disk or an NFS mount)."""
    return is_local_url(where.url)


def local_path(where: Location) -> str:
    """The local filesystem path of a local location."""
    url = where.url
    if not is_local_url(url):
        raise ValueError(f"{url} is not on a local filesystem")
    return url[len("file://") :] if url.startswith("file://") else url
