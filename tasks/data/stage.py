"""Stage a dataset: validate, tokenize once, split, write Parquet shards and the manifest (last).

The dataset id is a digest of everything that determines the staged bytes, so unchanged input finds
its complete copy ("already staged") and any change makes a new dataset. A directory without
manifest.json is an interrupted staging: it is cleared and staged again.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from config import layout
from config.digest import digest_bytes, digest_url
from config.errors import UserError
from config.manifest import file_entry, read_manifest, verify_files
from config.schema import DataConfig
from config.spec import DatasetRef
from config.storage import exists, filesystem, join, write_bytes_atomic, write_json_atomic
from tasks.data.records import Record, read_records
from tasks.data.tokenize import IGNORE_INDEX, encode, tokenizer_fingerprint

log = logging.getLogger(__name__)
SHARD_SCHEMA = pa.schema([("input_ids", pa.list_(pa.int32())), ("labels", pa.list_(pa.int32()))])


def record_digest(record: Record) -> str:
    """Digest of a normalized record: the split key and part of the dataset id."""
    return digest_bytes(json.dumps(record.messages, ensure_ascii=False).encode(), "blake3")


def in_eval(digest: str, eval_ratio: float) -> bool:
    """Deterministic split: a record goes to eval when its digest falls below the ratio."""
    return int(digest[:8], 16) / 0x1_0000_0000 < eval_ratio


def dataset_identity(digests: list[str], fingerprint: dict[str, Any], data: DataConfig) -> str:
    """`ds-<16 hex>` over what determines the bytes: records, tokenizer, and the shaping settings."""
    identity = {
        "schema": layout.DATASET_SCHEMA,
        "records": digest_bytes("\n".join(digests).encode(), "blake3"),
        "tokenizer": fingerprint,
        "max_length": data.max_length,
        "eval_ratio": data.eval_ratio,
        "shard_rows": data.shard_rows,
        "digest_algorithm": data.digest_algorithm,
    }
    return "ds-" + digest_bytes(json.dumps(identity, sort_keys=True).encode(), "blake3")[:16]


def write_shards(base: str, split: str, rows: list[tuple[list[int], list[int]]], shard_rows: int) -> list[str]:
    """Write rows as Parquet shards of at most shard_rows examples; returns their relative paths."""
    paths = []
    for index, start in enumerate(range(0, max(len(rows), 1), shard_rows)):
        chunk = rows[start : start + shard_rows]
        table = pa.table(
            {"input_ids": [ids for ids, _ in chunk], "labels": [labels for _, labels in chunk]}, schema=SHARD_SCHEMA
        )
        buffer = io.BytesIO()
        pq.write_table(table, buffer, compression="zstd")
        relpath = layout.shard_name(split, index)
        write_bytes_atomic(join(base, relpath), buffer.getvalue())
        paths.append(relpath)
    return paths


def split_counts(rows: list[tuple[list[int], list[int]]], truncated: int) -> dict[str, int]:
    """Records, tokens and predicted target tokens (labels after the shift, not -100)."""
    return {
        "records": len(rows),
        "tokens": sum(len(ids) for ids, _ in rows),
        "target_tokens": sum(sum(1 for label in labels[1:] if label != IGNORE_INDEX) for _, labels in rows),
        "truncated": truncated,
    }


def stage_dataset(data: DataConfig, storage: str, model_path: str, progress: Callable[[str], None] = log.info) -> DatasetRef:
    """Stage data.source under {storage}/datasets/{id}; reuse a complete copy if there is one."""
    from transformers import AutoTokenizer

    records = read_records(data.source, data.format)
    digests = [record_digest(r) for r in records]
    fingerprint = tokenizer_fingerprint(model_path)
    dataset_id = dataset_identity(digests, fingerprint, data)
    base = layout.dataset_dir(storage, dataset_id)
    if exists(join(base, layout.MANIFEST)):
        manifest, manifest_digest = read_manifest(base, layout.DATASET_SCHEMA)
        verify_files(base, manifest, mode="size")
        progress(f"dataset {dataset_id} already staged at {base}")
        return DatasetRef(dataset_id=dataset_id, url=base, manifest_digest=manifest_digest)
    if exists(base):  # an interrupted staging: no manifest means it never existed
        fs, path = filesystem(base)
        fs.rm(path, recursive=True)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    splits: dict[str, list[tuple[list[int], list[int]]]] = {split: [] for split in layout.SPLITS}
    truncated = dict.fromkeys(layout.SPLITS, 0)
    for record, digest in zip(records, digests, strict=True):
        messages = [{"role": role, "content": text} for role, text in record.messages]
        enc = encode(tokenizer, messages, data.max_length, record.location)
        split = "eval" if in_eval(digest, data.eval_ratio) else "train"
        splits[split].append((enc.input_ids, enc.labels))
        truncated[split] += enc.truncated
    for split, rows in splits.items():
        if not rows and (split == "train" or data.eval_ratio > 0):
            raise UserError(f"data.source {data.source}: the {split} split is empty ({len(records)} records, "
                            f"data.eval_ratio={data.eval_ratio}); add records or change data.eval_ratio")
    progress(f"tokenized {len(records)} records: " + ", ".join(f"{s} {len(r)}" for s, r in splits.items()))
    files = []
    for split, rows in splits.items():
        for relpath in write_shards(base, split, rows, data.shard_rows) if rows else []:
            files.append(file_entry(base, relpath, data.digest_algorithm))
    source_digest, source_size = digest_url(data.source, data.digest_algorithm)
    manifest = {
        "schema": layout.DATASET_SCHEMA,
        "dataset_id": dataset_id,
        "digest_algorithm": data.digest_algorithm,
        "files": files,
        "splits": {split: split_counts(rows, truncated[split]) for split, rows in splits.items()},
        "sources": [{"url": data.source, "size": source_size, "digest": source_digest, "format": "qwen"}],
        "tokenizer": fingerprint,
        "max_length": data.max_length,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    raw = write_json_atomic(join(base, layout.MANIFEST), manifest)
    progress(f"staged dataset {dataset_id} at {base}")
    return DatasetRef(dataset_id=dataset_id, url=base, manifest_digest=digest_bytes(raw, data.digest_algorithm))
