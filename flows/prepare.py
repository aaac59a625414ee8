"""Prepare: resolve the base model, then validate, tokenize and stage the data with a verified manifest.

    python -m flows.prepare --data data/sample/conversations.json
    python -m flows.prepare --data 'data/raw/*.jsonl' --format sharegpt --storage s3://bucket/tandem
    python -m flows.prepare --config qwen-7b-lora --data /mnt/shared/train.json --set data.max_length=2048
    python -m flows.prepare --config qwen-7b-lora --set run.name=r1 --write-spec   # for nodes started by hand
    python -m flows.prepare --data data/sample/conversations.json --format qwen --print-config   # nothing run

Runs alone, or as the first subflow of `flows.finetune`. Prints the dataset id, the manifest URL and the
counts. Unchanged input is found already staged (and cached by Prefect) instead of being staged again.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NamedTuple

from prefect import flow, get_run_logger

from config.schema import FinetuneConfig
from flows.cli import add_config_arguments, enter, run_config_cli
from pipeline.plan import build_spec, new_run_id, record_model
from staging.formats import FORMATS as SOURCE_FORMATS
from storage import layout
from storage.location import Location, join
from storage.manifest import read_manifest
from storage.spec import DatasetRef, write_spec
from tasks.prepare import prepare_dataset, prepare_model

FORMATS = ("auto", *SOURCE_FORMATS)


class Prepared(NamedTuple):
    """What training needs from the prepare step."""

    model_path: str
    dataset: DatasetRef


@flow(name="prepare", log_prints=True)
def prepare(config: FinetuneConfig = FinetuneConfig()) -> Prepared:  # noqa: B008 - the UI form's defaults
    """Resolve the base model and stage the dataset tokenized with its tokenizer."""
    return stage_inputs(enter(config))


def stage_inputs(cfg: FinetuneConfig) -> Prepared:
    """The prepare steps for a config already past the flow boundary (flows/cli.py `enter`)."""
    model_path = prepare_model(cfg)
    dataset = prepare_dataset(cfg, model_path)
    manifest = join(dataset.location(layout.root(cfg.run)), layout.MANIFEST)
    get_run_logger().info("dataset %s: %s", dataset.dataset_id, manifest)
    return Prepared(model_path, dataset)


def summary_rows(dataset: DatasetRef, storage: Location) -> list[tuple[str, str]]:
    """The CLI's summary: id, manifest URL, and the counts from the manifest (of a dataset staged under `storage`)."""
    staged = dataset.location(storage)
    manifest, _ = read_manifest(staged, layout.DATASET_SCHEMAS)
    rows = [("dataset", dataset.dataset_id), ("manifest", str(join(staged, layout.MANIFEST)))]
    for split in layout.SPLITS:
        counts = manifest["splits"][split]
        rows.append(
            (
                split,
                f"{counts['records']} records, {counts['tokens']} tokens, "
                f"{counts['target_tokens']} target tokens, {counts['truncated']} truncated, "
                f"{counts['dropped']} dropped",
            )
        )
    sources = manifest["mix"]["sources"]
    if len(sources) > 1:  # several sources: what each gave
        rows += [
            (
                "source",
                f"{s['key']} ({s['entry'] or s['source']}): {s['records']} records, {s['rejected']} rejected"
                + undesirable(s),
            )
            for s in sources
        ]
    records = manifest["records"]
    see = f" (see {join(staged, manifest['rejects'])})" if manifest["rejects"] else ""
    rows.append(
        (
            "records",
            f"{records['read']} read, {records['staged']} staged, {records['rejected']} rejected, "
            f"{records['dropped']} dropped{undesirable(records)}{see}",
        )
    )
    if manifest.get("packing"):  # absent from manifests written before packing existed
        splits = manifest["splits"]
        rows.append(
            (
                "packing",
                ", ".join(
                    f"{split} {splits[split]['records']} records in {splits[split]['rows']} rows"
                    for split in layout.SPLITS
                )
                + f" of up to {manifest['max_length']} tokens",
            )
        )
    return rows


def undesirable(counts: dict[str, Any]) -> str:
    """`, N undesirable` when data.preference=chosen left KTO records labelled false out (absent from manifests
    written before it existed)."""
    return f", {counts['undesirable']} undesirable" if counts.get("undesirable") else ""


def overrides(args: argparse.Namespace) -> list[str]:
    """--set values, then the dedicated flags (JSON-quoted, so a path is never read as YAML)."""
    out = list(args.overrides)
    for key, value in (("data.source", args.data), ("data.format", args.format), ("run.storage", args.storage)):
        if value is not None:
            out.append(f"{key}={json.dumps(value)}")
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m flows.prepare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", metavar="SRC", help="data.source: a file, directory, glob or URL (s3://...)")
    parser.add_argument("--format", choices=FORMATS, help="data.format (default: auto, decided per file)")
    parser.add_argument("--storage", metavar="URL", help="run.storage: a local/NFS path or s3://bucket/prefix")
    parser.add_argument(
        "--write-spec",
        action="store_true",
        help="also write the run's spec.json (run.name, or a new id) for `python -m flows.node --spec`",
    )
    add_config_arguments(parser)
    args = parser.parse_args(argv)

    def body(cfg: FinetuneConfig) -> int:
        result: Any = prepare(cfg)
        rows = summary_rows(result.dataset, layout.root(cfg.run))
        if args.write_spec:  # what the pipeline writes before training, for nodes launched by hand
            run_id = new_run_id(cfg)
            digest = record_model(cfg, run_id, result.model_path)
            spec = build_spec(cfg, run_id, result.model_path, result.dataset, digest)
            write_spec(spec)
            # what `python -m flows.node --spec` takes: the URL, or with run.storage_options the JSON location
            rows.append(("spec", join(spec.run, layout.SPEC).argument()))
        print("\n" + "\n".join(f"{name:<10}{value}" for name, value in rows))
        return 0

    return run_config_cli(args, overrides(args), body)


if __name__ == "__main__":
    sys.exit(main())
