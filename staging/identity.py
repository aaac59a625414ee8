"""What a staged dataset is named after, and what finds it again.

- The dataset id digests what determines the staged bytes: the normalized records in order (each image named by
  the digest of its bytes), the tokenizer (its files, the chat template and a vision-language model's image
  processor among them), the pixel settings that decide an image's tokens, max_length and excess_length, the split
  settings, the shard size, the digest algorithm, whether the examples are packed (data.packing as resolved for the
  formats found), and the rejects (rejects.jsonl is staged too). Moving or reformatting a source file (or an image),
  or changing data.num_proc, changes none of these, so it names the same dataset.
- The source key digests the inputs instead: the source files' digests and URLs, how each source is read (format,
  columns, tags, weight, cap, the dataset_info.json entry it came from) and mixed, plus the same settings.
  It is computed without parsing a record, and `{storage}/datasets/by-source/{key}.json` maps it to the
  dataset id, so unchanged input is found again in the time it takes to digest the source files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from config.sections.run_data import DataConfig
from staging.progress import Reporter
from staging.sources import expand
from staging.streams import Stream, resolve
from staging.vision import Vision
from storage import layout
from storage.digest import digest_bytes, hasher
from storage.fs import read_range, size
from storage.location import Location

# Bump when normalization or tokenization changes what is staged for the same input and settings.
PIPELINE_VERSION = 7
READ_BLOCK = 8 * 1024 * 1024


@dataclass(frozen=True)
class SourceFile:
    """One data file: which config key it came from, and its size and digest."""

    key: str  # the stream's config key (staging/streams.py)
    url: Location
    size: int
    digest: str


@dataclass(frozen=True)
class Inputs:
    """Everything staging depends on, known before a record is parsed."""

    files: list[SourceFile]
    fingerprint: dict[str, Any]
    source_key: str
    streams: list[Stream]
    model: str = ""  # model.name_or_path
    vision: Vision | None = None  # a vision-language model's images (None: a text-only model refuses them)


def shaping(data: DataConfig) -> dict[str, Any]:
    """The settings that shape the staged bytes (not where the data is read from, nor how fast)."""
    split = (
        {"eval_source": True}
        if data.eval_source
        else {"eval_ratio": data.eval_ratio, "eval_max_records": data.eval_max_records}
    )
    return {
        "max_length": data.max_length,
        "shard_rows": data.shard_rows,
        "digest_algorithm": data.digest_algorithm,
        "split": split,
        "enable_thinking": data.enable_thinking,
        "mask_history": data.mask_history,
        "excess_length": data.excess_length,
    }


def source_files(streams: list[Stream]) -> list[tuple[str, Location]]:
    """(config key, location) of every data file of every stream, in stream order."""
    return [(stream.key, url) for stream in streams for url in expand(stream.location, stream.key)]


def digest_sources(files: list[tuple[str, Location]], algorithm: str, reporter: Reporter) -> list[SourceFile]:
    """Size and digest of every source file (read once, in large blocks)."""
    sizes = [size(url) for _, url in files]
    out = []
    with reporter.phase("digesting sources", sum(sizes), "B") as phase:
        for (key, url), total in zip(files, sizes, strict=True):
            h = hasher(algorithm)
            offset = 0
            while block := read_range(url, offset, offset + READ_BLOCK):  # retried block by block
                offset += len(block)
                h.update(block)
                phase.update(len(block))
            out.append(SourceFile(key, url, total, h.hexdigest()))
    return out


def survey(
    data: DataConfig, fingerprint: dict[str, Any], reporter: Reporter, model: str = "", vision: Vision | None = None
) -> Inputs:
    """The source files with their digests, and the source key over them and the settings (`model` and `vision`,
    the model's path and images, ride along: the fingerprint already names what of them shapes the bytes)."""
    streams = resolve(data)
    files = digest_sources(source_files(streams), data.digest_algorithm, reporter)
    doc = {
        "pipeline": PIPELINE_VERSION,
        "files": [[f.key, str(f.url), f.digest] for f in files],
        "streams": [stream.describe() for stream in streams],
        "mix": data.mix,
        "on_invalid": data.on_invalid,
        "preference": data.preference_mode,
        **({"require_answer": bool(data.require_answer)} if data.preference_mode == "prompts" else {}),
        "packing": data.packing,
        "shaping": shaping(data),
        "images": [data.image_min_pixels, data.image_max_pixels],
        "tokenizer": fingerprint,
    }
    key = digest_bytes(json.dumps(doc, sort_keys=True).encode(), "blake3")[:32]
    return Inputs(files, fingerprint, key, streams, model, vision)


def eval_key(record_digest: bytes) -> int:
    """Where a record falls in [0, 2^32): below eval_ratio x 2^32 it is held out (data.eval_max_records keeps the
    lowest of those)."""
    return int.from_bytes(record_digest[:4], "big")


def in_eval(record_digest: bytes, eval_ratio: float) -> bool:
    """Deterministic split: a record goes to eval when its digest falls below the ratio."""
    return eval_key(record_digest) / 0x1_0000_0000 < eval_ratio


def dataset_id(
    records_digest: str,
    rejects_digest: str | None,
    fingerprint: dict[str, Any],
    data: DataConfig,
    packed: bool,
    images: dict[str, Any] | None = None,
) -> str:
    """`ds-<16 hex>` over what determines the staged bytes (`images`: how a dataset with images cut them into
    tokens, staging/vision.py `Vision.describe`; None without images)."""
    identity = {
        "packing": packed,
        "schema": layout.DATASET_SCHEMA,
        "pipeline": PIPELINE_VERSION,
        "records": records_digest,
        "rejects": rejects_digest,
        "tokenizer": fingerprint,
        **shaping(data),
        **({"images": images} if images else {}),
    }
    return "ds-" + digest_bytes(json.dumps(identity, sort_keys=True).encode(), "blake3")[:16]
