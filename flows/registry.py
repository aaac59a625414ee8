"""Read the model registry: list versions, show one entry and how to load it. No Prefect server needed.

    python -m flows.registry list                         # every model, every version
    python -m flows.registry list tandem-tiny
    python -m flows.registry show tandem-tiny:champion    # or tandem-tiny:v0002, tandem-tiny:2, tandem-tiny
    python -m flows.registry --storage s3://bucket/tandem list
    python -m flows.registry sync tandem-tiny             # complete the MLflow mirror (MLFLOW_TRACKING_URI)

--storage is the run.storage the pipeline registered into (default: the schema's, .tandem/storage). For S3-compatible
stores set AWS_ENDPOINT_URL (and credentials) in the environment, or give the endpoint with the URL as
run.storage_options would: --storage '{"url": "s3://bucket/tandem", "options": {"endpoint_url": "http://minio:9000"}}'.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from config.loader import resolve_local
from config.sections.results import MLFLOW_URI_ENV
from config.sections.run_data import RunConfig
from core.errors import RetryableError, UserError
from flows.cli import run_cli
from pipeline.model_card import load_snippet
from storage.location import ARGUMENT_FORM, Location, location_argument
from storage.registry import champion, models, read_entry, resolve, versions
from tracking.mlflow_sink import check_server

COLUMNS = ("model", "version", "created", "loss", "perplexity", "token_accuracy", "champion")


def rows(storage: Location, model: str) -> list[dict[str, str]]:
    """One table row per version of a model."""
    alias = champion(storage, model)
    out = []
    for version in versions(storage, model):
        entry = read_entry(storage, model, version)
        metrics = entry["metrics"]
        out.append(
            {
                "model": model,
                "version": f"v{version:04d}",
                "created": entry["created_at"],
                "loss": f"{metrics['loss']:.4f}",
                "perplexity": f"{metrics['perplexity']:.2f}" if "perplexity" in metrics else "-",
                "token_accuracy": f"{metrics['token_accuracy']:.4f}" if "token_accuracy" in metrics else "-",
                "champion": "*" if alias and alias["version"] == version else "",
            }
        )
    return out


def table(records: list[dict[str, str]]) -> str:
    """Left-aligned columns, two spaces apart."""
    widths = {c: max(len(c), *(len(r[c]) for r in records)) for c in COLUMNS}
    lines = ["  ".join(c.ljust(widths[c]) for c in COLUMNS).rstrip()]
    lines += ["  ".join(r[c].ljust(widths[c]) for c in COLUMNS).rstrip() for r in records]
    return "\n".join(lines)


def cmd_list(storage: Location, model: str | None) -> int:
    """Print the versions table."""
    names = [model] if model else models(storage)
    if model and not versions(storage, model):
        known = ", ".join(models(storage)) or "none"
        raise UserError(f"{model}: no such model in {storage}/registry (models: {known})")
    records = [row for name in names for row in rows(storage, name)]
    print(table(records) if records else f"no models registered in {storage}/registry")
    return 0


def cmd_show(storage: Location, ref: str) -> int:
    """Print one entry and how to load its model."""
    entry = resolve(storage, ref)
    alias = champion(storage, entry["model"])
    mark = " (champion)" if alias and alias["version"] == entry["version"] else ""
    print(f"{entry['model']} v{entry['version']:04d}{mark}\n")
    print(json.dumps(entry, indent=2, sort_keys=True))
    if "base_model" in entry:
        print(f"\nHow to load:\n\n{load_snippet(entry)}")
    return 0


def cmd_sync(storage: Location, model: str, uri: str | None) -> int:
    """Mirror into MLflow's model registry what it lacks of `model` (pending mirrors) and the champion alias."""
    from tracking.mlflow_registry import sync

    uri = uri or os.environ.get(MLFLOW_URI_ENV)
    if not uri:
        raise UserError(f"sync: no MLflow server: pass --mlflow-uri or set {MLFLOW_URI_ENV}")
    if not versions(storage, model):
        known = ", ".join(models(storage)) or "none"
        raise UserError(f"{model}: no such model in {storage}/registry (models: {known})")
    check_server(uri)
    if not sync(storage, model, uri, print):
        raise RetryableError(f"sync: the MLflow mirror of {model} is still pending (see above); run it again")
    return 0


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m flows.registry", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--storage",
        default=Location(RunConfig().storage),
        type=location_argument,
        help=f"run.storage: {ARGUMENT_FORM} (default: %(default)s)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="versions of one model or of every model")
    listing.add_argument("model", nargs="?", help="model name (register.model_name)")
    show = sub.add_parser("show", help="one entry, with how to load the model")
    show.add_argument("ref", metavar="MODEL[:VERSION|:champion]")
    mirror = sub.add_parser("sync", help="complete the mirror of a model in MLflow's model registry")
    mirror.add_argument("model", help="model name (register.model_name)")
    mirror.add_argument("--mlflow-uri", default=None, help=f"MLflow tracking server (default: ${MLFLOW_URI_ENV})")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    args: Any = parse(argv)
    # Credentials of an object store come from the environment (AWS_PROFILE, ...), its endpoint from there too or
    # from the options given with --storage.
    given: Location = args.storage
    storage = given if "://" in given.url else given.with_url(resolve_local(given.url))

    def body() -> int:
        if args.command == "sync":
            return cmd_sync(storage, args.model, args.mlflow_uri)
        return cmd_list(storage, args.model) if args.command == "list" else cmd_show(storage, args.ref)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
