"""Stage a dataset: validate, tokenize once, split, write Parquet shards, rejects and the manifest (last).

    sources --digest--> source key --by-source index--> already staged?  (no record parsed)
            --read, validate, digest (num_proc), spool--> dataset id --manifest there?--> already staged
            --tokenize (num_proc)--> [pack (data.packing)] --> shards --> rejects.jsonl --> manifest.json --> index

The dataset id names what determines the bytes (see staging/identity.py), so unchanged input finds its
complete copy and any change makes a new dataset. A directory without manifest.json is an interrupted
staging: it is cleared and staged again.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from config.footprint import read_model_json
from config.sections.run_data import DataConfig
from core.errors import UserError
from staging.identity import Inputs, dataset_id, survey
from staging.images import changed_source, stage_images
from staging.packing import PackingWriter, packing_enabled, split_writer
from staging.progress import Reporter
from staging.records import RecordError, Reject
from staging.scan import EVAL, Scan, scan_sources
from staging.streams import label
from staging.tokenize import EncoderSettings
from staging.tokenizer import tokenizer_fingerprint
from staging.vision import vision_of
from staging.workers import ChunkResult, encode_chunks, worker_count
from storage import layout
from storage.digest import digest_bytes
from storage.fs import (
    exists,
    filesystem,
    find_sizes,
    read_bytes,
    read_json,
    remove,
    write_bytes_atomic,
    write_json_atomic,
)
from storage.location import Location, is_local, join
from storage.manifest import read_manifest, verify_files
from storage.shards import FileEntry, PreferenceWriter, PromptWriter, SplitWriter, split_rows
from storage.spec import DatasetRef

log = logging.getLogger(__name__)
# More than this share of records cut by data.max_length is said in a warning line (a count in the manifest is missed).
TRUNCATION_WARN_SHARE = 0.05


def stage_dataset(
    data: DataConfig,
    storage: Location,
    model_path: str,
    progress: Callable[[str], None] = log.info,
    bars: bool | None = None,
    chat_template: str | None = None,
    length_note: str | None = None,
    trust_remote_code: bool = False,
) -> DatasetRef:
    """Stage data.source under {storage}/datasets/{id}; reuse a complete copy if there is one. `chat_template`
    (model.chat_template's text) replaces the tokenizer's template; `length_note` ends the warning of many records
    cut by data.max_length (why the setting may be too small); `trust_remote_code` (model.trust_remote_code) lets the
    tokenizer's own code run."""
    reporter = Reporter(progress, bars)
    fingerprint = tokenizer_fingerprint(model_path, chat_template)
    inputs = survey(data, fingerprint, reporter, model_path, vision_of(model_path, read_model_json(model_path), data))
    found = find_staged(storage, inputs.source_key, reporter, data.storage_options)
    if found is not None:
        return found
    with tempfile.TemporaryDirectory(prefix="tandem-prepare-") as tmp:
        spool = Path(tmp) / "records.spool"
        scan = scan_sources(inputs, data, spool, reporter)
        rejects_digest = digest_bytes(rejects_jsonl(scan.rejects), "blake3") if scan.rejects else None
        packed = packing_enabled(data, (source["format"] for source in scan.sources if source["records"]))
        images = inputs.vision.describe() if inputs.vision is not None and scan.images else None
        name = dataset_id(scan.records_digest, rejects_digest, fingerprint, data, packed, images)
        base = layout.dataset_dir(storage, name)
        ref = reuse(base, name, reporter)
        if ref is None:
            clear(base)
            try:
                settings = EncoderSettings(
                    model_path,
                    data.max_length,
                    chat_template,
                    data.enable_thinking,
                    data.mask_history,
                    data.excess_length,
                    trust_remote_code,
                    inputs.vision,
                )
                ref = write_dataset(base, name, scan, inputs, data, settings, spool, reporter, packed, length_note)
            except Exception:
                clear(base)  # it failed on its own data: no later run completes this directory
                raise
    write_json_atomic(
        layout.dataset_index(storage, inputs.source_key), {"schema": layout.DATASET_INDEX_SCHEMA, "dataset_id": name}
    )
    return ref


def find_staged(storage: Location, source_key: str, reporter: Reporter, options: Any = None) -> DatasetRef | None:
    """The complete dataset that these very inputs were staged to, if any (its images still the bytes they were
    staged from: `options`, data.storage_options, reach their sources)."""
    index = layout.dataset_index(storage, source_key)
    if not exists(index):
        return None
    doc = read_json(index)
    if doc.get("schema") != layout.DATASET_INDEX_SCHEMA:
        return None
    base = layout.dataset_dir(storage, doc["dataset_id"])
    found = reuse(base, doc["dataset_id"], reporter)
    if found is not None and (changed := changed_source(read_manifest(base, layout.DATASET_SCHEMAS)[0], options)):
        reporter.info(f"{changed} changed since dataset {found.dataset_id} was staged; reading the records again")
        return None
    return found


def reuse(base: Location, name: str, reporter: Reporter) -> DatasetRef | None:
    """A reference to a complete staged copy (manifest there, every file present with its size), or None."""
    if not exists(join(base, layout.MANIFEST)):
        return None
    manifest, manifest_digest = read_manifest(base, layout.DATASET_SCHEMAS)
    try:
        verify_files(base, manifest, mode="size")
    except UserError as exc:
        reporter.info(f"dataset {name} is damaged ({exc}); staging it again")
        return None
    reporter.info(f"dataset {name} already staged at {base}")
    return DatasetRef(
        dataset_id=name,
        url=str(base),
        manifest_digest=manifest_digest,
        split_records={split: split_rows(c) for split, c in manifest["splits"].items()},
    )


def clear(base: Location) -> None:
    """Remove a dataset directory, its manifest first, so that a half-removed one is never complete."""
    if not exists(base):
        return
    remove(join(base, layout.MANIFEST))
    remove(base, recursive=True)


def rejects_jsonl(rejects: list[Reject]) -> bytes:
    """rejects.jsonl: one {"location", "reason"} per line."""
    return b"".join(orjson.dumps({"location": r.location, "reason": r.reason}) + b"\n" for r in rejects)


def route(result: ChunkResult, splits: np.ndarray, writers: dict[str, SplitWriter | PackingWriter]) -> None:
    """Send a tokenized chunk's examples to the writer of their split, in record order."""
    batch = result.batch
    if not len(batch.kept):
        return
    is_eval = splits[result.chunk.first + batch.kept] == EVAL
    token_is_eval = np.repeat(is_eval, batch.lengths)
    for split, rows, tokens in (("eval", is_eval, token_is_eval), ("train", ~is_eval, ~token_is_eval)):
        writer = writers[split]
        if isinstance(writer, PromptWriter):
            assert batch.records is not None, "prompt rows without their records"
            picked = [record for record, keep in zip(batch.records, rows, strict=True) if keep]
            writer.add_prompts(batch.ids[tokens], batch.lengths[rows], batch.truncated[rows], picked)
            continue
        if isinstance(writer, PreferenceWriter):
            assert batch.segments is not None and batch.feedback is not None, "preference rows without segments"
            segments, feedback = batch.segments[rows], batch.feedback[rows]
            writer.add_rows(batch.ids[tokens], batch.labels[tokens], segments, feedback, batch.truncated[rows])
            continue
        pictures = [batch.images[i] for i in np.flatnonzero(rows)] if batch.images else []
        writer.add(batch.ids[tokens], batch.labels[tokens], batch.lengths[rows], batch.truncated[rows], images=pictures)


def write_dataset(
    base: Location,
    name: str,
    scan: Scan,
    inputs: Inputs,
    data: DataConfig,
    settings: EncoderSettings,
    spool: Path,
    reporter: Reporter,
    packed: bool,
    length_note: str | None = None,
) -> DatasetRef:
    """Tokenize the spool into shards (packed into rows when `packed`), then write rejects.jsonl and, last, the
    manifest."""
    files, counts, rejects, longest = write_shards(base, scan, data, settings, spool, reporter, packed)
    check_counts(counts, data)
    images = stage_images(scan.images, base, settings.vision, data.digest_algorithm, reporter)
    files += images.files
    if warning := length_warning(counts, longest, data, length_note):
        reporter.info(warning)
    if rejects:
        body = rejects_jsonl(rejects)
        write_bytes_atomic(join(base, layout.REJECTS), body)
        files.append({"path": layout.REJECTS, "size": len(body), "digest": digest_bytes(body, data.digest_algorithm)})
        reporter.info(f"{len(rejects)} records rejected, dropped or left out; see {join(base, layout.REJECTS)}")
    manifest = build_manifest(name, files, counts, scan, inputs, data, rejects, packed) | images.manifest()
    raw = write_json_atomic(join(base, layout.MANIFEST), manifest)
    reporter.info(
        f"staged dataset {name} at {base}: "
        + ", ".join(
            f"{split} {c['records']} records"
            + (f" packed into {c['rows']} rows" if packed else "")
            + f" / {c['tokens']} tokens"
            for split, c in counts.items()
        )
    )
    return DatasetRef(
        dataset_id=name,
        url=str(base),
        manifest_digest=digest_bytes(raw, data.digest_algorithm),
        split_records={split: c["rows"] for split, c in counts.items()},
    )


def write_shards(
    base: Location,
    scan: Scan,
    data: DataConfig,
    settings: EncoderSettings,
    spool: Path,
    reporter: Reporter,
    packed: bool,
) -> tuple[list[FileEntry], dict[str, dict[str, int]], list[Reject], int]:
    """Tokenize the spool in data.num_proc processes into each split's shards: (the shards, each split's counts, the
    rejects of both passes, the longest record's tokens before any cut)."""
    verb = "written" if is_local(base) else "uploaded"
    written: list[FileEntry] = []
    rejects = list(scan.rejects)
    splits = np.frombuffer(bytes(scan.splits), dtype=np.uint8)
    processes = worker_count(data.num_proc, len(scan.chunks))
    reporter.info(f"tokenizing {scan.spooled} records in {processes} process{'es' if processes > 1 else ''}")
    results = encode_chunks(spool, scan.chunks, settings, processes)
    with reporter.phase("tokenizing", scan.spooled, "records") as phase:

        def on_write(entry: FileEntry) -> None:
            written.append(entry)
            seconds = sum(w.seconds for w in writers.values())
            phase.annotate(
                f"{len(written)} shards ({sum(e['size'] for e in written) / 1e6:.1f} MB) {verb} in {seconds:.1f} s"
            )

        writers = {
            split: split_writer(base, split, data, on_write, packed, spool.parent, bool(scan.images))
            for split in layout.SPLITS
        }
        dropped = dict.fromkeys(layout.SPLITS, 0)
        longest = 0
        for result in results:
            longest = max(longest, result.batch.longest)
            keep_rejects(result, splits, data, rejects, dropped)
            route(result, splits, writers)
            phase.update(result.chunk.count)
        files = [entry for split in layout.SPLITS for entry in writers[split].close()]
    counts = {split: {**writer.counts, "dropped": dropped[split]} for split, writer in writers.items()}
    return files, counts, rejects, longest


def length_warning(counts: dict[str, dict[str, int]], longest: int, data: DataConfig, note: str | None) -> str | None:
    """One warning line when more than TRUNCATION_WARN_SHARE of the records were cut (or dropped) by data.max_length:
    how many, the longest, and the setting to raise; `note` says why the setting may be too small."""
    cut = sum(c["truncated"] + c["dropped"] for c in counts.values())
    records = sum(c["records"] + c["dropped"] for c in counts.values())
    if not records or cut / records <= TRUNCATION_WARN_SHARE:
        return None
    how = "truncated" if data.excess_length == "truncate" else "dropped"
    return (
        f"warning: {cut} of {records} records ({cut / records:.0%}) are longer than data.max_length={data.max_length} "
        f"tokens and were {how} (the longest: {longest} tokens); raise data.max_length (to {longest} to keep every "
        "record whole)" + (f"; {note}" if note else "")
    )


def keep_rejects(
    result: ChunkResult, splits: np.ndarray, data: DataConfig, rejects: list[Reject], dropped: dict[str, int]
) -> None:
    """A tokenized chunk's rejects and over-long records into `rejects` (counting the dropped per split), or raised
    when data.on_invalid / data.excess_length say fail."""
    for reject in result.rejects:
        if data.on_invalid == "fail":
            raise reject.error()
        rejects.append(reject)
    for index, over in result.dropped:
        if data.excess_length == "fail":
            raise RecordError(
                f"{over.location}: {over.reason}; raise data.max_length, or set data.excess_length=truncate (or drop)"
            )
        # With truncate, a record is dropped only where its window would cut an image: its reason says so.
        suffix = " (data.excess_length=drop)" if data.excess_length == "drop" else ""
        rejects.append(Reject(over.location, over.reason + suffix))
        dropped["eval" if splits[result.chunk.first + index] == EVAL else "train"] += 1


def check_counts(counts: dict[str, dict[str, int]], data: DataConfig) -> None:
    """Splits emptied by records the tokenizer could not use are as much an error as splits read empty; preference
    data of both kinds (pairs and KTO's labelled answers), which no one objective trains, is refused."""
    pairs = sum(c.get("pairs", 0) for c in counts.values())
    labelled = sum(c.get("desirable", 0) + c.get("undesirable", 0) for c in counts.values())
    if pairs and labelled:
        raise UserError(
            f"{label(data)}: {pairs} preference pairs and {labelled} KTO records (answers labelled true or false) in "
            "one dataset; an objective trains one kind (train.objective dpo, ipo or orpo: pairs; kto: labelled "
            "answers): stage them as two datasets"
        )
    for split in layout.SPLITS:
        if counts[split]["records"] or (split == "eval" and not (data.eval_source or data.eval_ratio > 0)):
            continue
        dropped = counts[split]["dropped"]
        why = (
            f"{dropped} dropped as longer than data.max_length={data.max_length} (data.excess_length=drop); "
            "raise data.max_length or set data.excess_length=truncate"
            if dropped
            else "see the rejects (data.on_invalid=skip) for the reasons"
        )
        raise UserError(f"{label(data)}: no record of the {split} split could be tokenized; {why}")


def build_manifest(
    name: str,
    files: list[FileEntry],
    counts: dict[str, dict[str, int]],
    scan: Scan,
    inputs: Inputs,
    data: DataConfig,
    rejects: list[Reject],
    packed: bool,
) -> dict[str, Any]:
    """The dataset manifest (docs/architecture.md), with the record accounting: read = staged + rejected +
    dropped + undesirable."""
    staged = sum(c["records"] for c in counts.values())
    dropped = sum(c["dropped"] for c in counts.values())
    undesirable = sum(source["undesirable"] for source in scan.sources)
    return {
        "schema": layout.DATASET_SCHEMA,
        "dataset_id": name,
        "digest_algorithm": data.digest_algorithm,
        "files": files,
        "splits": counts,
        "records": {
            "read": scan.spooled + len(scan.rejects),
            "staged": staged,
            "rejected": len(rejects) - dropped - undesirable,
            "dropped": dropped,
            "undesirable": undesirable,
        },
        "rejects": layout.REJECTS if rejects else None,
        "sources": scan.sources,
        "mix": {"strategy": data.mix, "sources": scan.streams},
        "tokenizer": inputs.fingerprint,
        "max_length": data.max_length,
        "packing": packed,
        "split": split_doc(data, scan),
        "shard_rows": data.shard_rows,
        "source_key": inputs.source_key,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def split_doc(data: DataConfig, scan: Scan) -> dict[str, Any]:
    """How the split was made (the manifest's `split`): the eval source, or the ratio, its cap and how many records
    the cap moved to train."""
    if data.eval_source:
        return {"eval_source": data.eval_source}
    return {"eval_ratio": data.eval_ratio, "eval_max_records": data.eval_max_records, "eval_capped": scan.eval_capped}


def staged_state(data: DataConfig, storage: Location, model_path: str, chat_template: str | None = None) -> str | None:
    """A digest of the inputs and of the staged dataset they map to (its manifest and the files present);
    None when nothing complete is staged for them. Prefect's task cache is keyed on it."""
    inputs = survey(data, tokenizer_fingerprint(model_path, chat_template), Reporter(log.debug, bars=False))
    index = layout.dataset_index(storage, inputs.source_key)
    if not exists(index):
        return None
    base = layout.dataset_dir(storage, read_json(index)["dataset_id"])
    manifest_url = join(base, layout.MANIFEST)
    if not exists(manifest_url) or changed_source(read_json(manifest_url), data.storage_options):
        return None
    _, path = filesystem(base)
    present = sorted((p[len(path) :], size) for p, size in find_sizes(base).items())
    state = {
        "source_key": inputs.source_key,
        "storage": str(storage),
        "files": present,
        "manifest": digest_bytes(read_bytes(manifest_url), "blake3"),
    }
    return digest_bytes(json.dumps(state, sort_keys=True).encode(), "blake3")
