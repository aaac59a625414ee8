"""The resolved run description, `spec.json`: written once by the flow, read and re-validated by every
node and every rank. Its digest is part of the lineage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import Field, ValidationError

from storage import layout
from storage.digest import digest_bytes
from config.chat_template import resolve_chat_template
from config.deepspeed import read_deepspeed_json, resolve_from_train
from config.errors import UserError
from config.schema import FinetuneConfig, Section, TrainConfig
from config.version import code_version
from storage.fs import read_bytes, write_json_atomic
from storage.manifest import read_manifest
from storage.shards import split_rows


class DatasetRef(Section):
    """A staged dataset, as the trainer and evaluator find it."""

    dataset_id: str
    url: str = Field(description="{storage}/datasets/{dataset_id}")
    manifest_digest: str
    # The rows of each split (its records, unless packed), as staging counted them: what a global batch counts.
    # Not written to spec.json (its format is unchanged); empty when the reference was read back from one.
    split_records: dict[str, int] = Field(default_factory=dict, exclude=True)

    def records(self, split: str) -> int | None:
        """Rows of a split when this reference carries the counts, else None."""
        return self.split_records.get(split)


class Attempt(Section):
    """One launch of the training job: which nodes (local backend: node slots 0..max_nnodes-1) ran it, on how many
    ranks, from which checkpoint step, and which nodes were left out and why."""

    number: int = Field(gt=0)
    nodes: list[int]
    world_size: int = Field(gt=0)
    from_step: int = Field(ge=0)
    left_out: dict[str, str] = Field(default_factory=dict, description="node slot -> why it was left out")

    def describe(self) -> str:
        """One line for logs and the model card."""
        out = (f"attempt {self.number}: nodes {','.join(map(str, self.nodes))} ({self.world_size} ranks) from step "
               f"{self.from_step}")
        return out + "".join(f"; node {slot} left out: {why}" for slot, why in self.left_out.items())


class Spec(Section):
    """Everything a rank needs: the config, resolved values, and where things are."""

    schema_name: str = Field(layout.SPEC_SCHEMA, alias="schema")
    run_id: str
    run_url: str
    config: FinetuneConfig
    deepspeed: dict[str, Any]
    world_size: int = Field(gt=0)
    total_steps: int = Field(gt=0, description="Optimizer steps of the whole run (train.max_steps or from epochs).")
    model_path: str = Field(description="Local directory of the base model (from_pretrained).")
    dataset: DatasetRef
    code_version: str
    chat_template: str | None = Field(
        None, description="The text of model.chat_template when set: what staging used and the export carries; "
        "None: the base model's own template (absent from specs written before it existed).")
    attempts: list[Attempt] = Field(
        default_factory=list, description="Launches of an elastic run so far, this one last (launch.min_nnodes/"
        "max_nnodes); empty for a run that is not elastic (absent from specs written before it existed).")


def total_steps(train: TrainConfig, train_records: int, world_size: int) -> int:
    """train.max_steps when set, else enough steps for train.epochs passes over the train split."""
    if train.max_steps is not None:
        return train.max_steps
    # With train.global_batch_size the rows per step, hence the step count and the schedule, ignore the world size.
    per_step = train.global_batch_size or train.micro_batch_size * train.gradient_accumulation_steps * world_size
    return max(1, math.ceil(train.epochs * train_records / per_step))


def build_spec(cfg: FinetuneConfig, run_id: str, model_path: str, dataset: DatasetRef) -> Spec:
    """Resolve the config once: world size, DeepSpeed "auto" values, absolute locations. Here, not in tasks/, so
    that what builds a spec without Prefect (the GPU benchmark on a machine without it) can."""
    ds = resolve_from_train(read_deepspeed_json(cfg.deepspeed.config), cfg.train, cfg.world_size)
    train_records = dataset.records("train")
    if train_records is None:  # a reference read back from spec.json carries no counts
        train_records = split_rows(read_manifest(dataset.url, layout.DATASET_SCHEMA)[0]["splits"]["train"])
    steps = total_steps(cfg.train, train_records, cfg.world_size)
    return Spec(
        run_id=run_id,
        run_url=layout.run_dir(cfg.run.storage, run_id),
        config=cfg,
        deepspeed=ds,
        world_size=cfg.world_size,
        total_steps=steps,
        model_path=model_path,
        dataset=dataset,
        code_version=code_version(),
        chat_template=resolve_chat_template(cfg.model.chat_template),
    )


def write_spec(spec: Spec) -> str:
    """Write spec.json into the run directory; returns the digest of its bytes."""
    data = write_json_atomic(layout.join(spec.run_url, layout.SPEC), spec.model_dump(mode="json", by_alias=True))
    return digest_bytes(data, "sha256")


def load_spec(url: str) -> tuple[Spec, str]:
    """(spec, sha256 of its bytes) from a spec.json URL, validated again."""
    try:
        raw = read_bytes(url)
    except FileNotFoundError:
        raise UserError(f"--spec {url}: no such file; pass the spec.json of a run") from None
    try:
        spec = Spec.model_validate_json(raw)
    except ValidationError as exc:
        raise UserError(f"{url}: not a valid {layout.SPEC_SCHEMA} document ({exc.error_count()} errors, "
                        f"first: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']})") from None
    if spec.schema_name != layout.SPEC_SCHEMA:
        raise UserError(f"{url}: schema {spec.schema_name!r} is not {layout.SPEC_SCHEMA!r}")
    return spec, digest_bytes(raw, "sha256")


@dataclass(frozen=True)
class WrittenSpec:
    """A spec.json on storage: the spec, where it is, and the sha256 of its bytes (checked by every node)."""

    spec: Spec
    url: str
    digest: str


def publish_spec(spec: Spec) -> WrittenSpec:
    """Write spec.json into the run directory and say where it is and what its bytes hash to."""
    return WrittenSpec(spec, layout.join(spec.run_url, layout.SPEC), write_spec(spec))
