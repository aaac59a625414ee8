"""The resolved run description, `spec.json`: written once by the flow, read and re-validated by every
node and every rank. Its digest is part of the lineage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field, ValidationError, model_validator

from config.schema import FinetuneConfig
from config.sections.base import Section
from core.errors import UserError
from storage import layout
from storage.digest import digest_bytes
from storage.fs import read_bytes, write_json_atomic
from storage.location import Location, join
from storage.rewards import RewardRef


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

    def location(self, storage: Location) -> Location:
        """The staged dataset's directory, reached with the options of the storage it was staged under (run.storage:
        the run directory's options)."""
        return storage.with_url(self.url)


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
        out = (
            f"attempt {self.number}: nodes {','.join(map(str, self.nodes))} ({self.world_size} ranks) from step "
            f"{self.from_step}"
        )
        return out + "".join(f"; node {slot} left out: {why}" for slot, why in self.left_out.items())


class Spec(Section):
    """Everything a rank needs: the config, resolved values, and where things are."""

    schema_name: str = Field(layout.SPEC_SCHEMA, alias="schema")
    run_id: str
    run: Location = Field(
        description="The run directory and the options that reach it (run.storage_options): {url, options}. Specs "
        "written before it existed have `run_url` and the options in their config (read by `_older_run_url`)."
    )
    config: FinetuneConfig
    deepspeed: dict[str, Any]
    world_size: int = Field(gt=0)
    total_steps: int = Field(gt=0, description="Optimizer steps of the whole run (train.max_steps or from epochs).")
    model_path: str = Field(description="Local directory of the base model (from_pretrained).")
    dataset: DatasetRef
    model_manifest_digest: str | None = Field(
        None,
        description="sha256 of {run}/base_model.json, the base model's files that every node's copy is checked "
        "against (absent from specs written before it existed: no check).",
    )
    code_version: str
    chat_template: str | None = Field(
        None,
        description="The text of model.chat_template when set: what staging used and the export carries; "
        "None: the base model's own template (absent from specs written before it existed).",
    )
    rewards: list[RewardRef] = Field(
        default_factory=list,
        description="train.objective=grpo: its reward functions (train.rl.rewards), each file's staged copy and sha256 "
        "(storage/rewards.py); empty for other objectives (absent from specs written before it existed).",
    )
    attempts: list[Attempt] = Field(
        default_factory=list,
        description="Launches of an elastic run so far, this one last (launch.min_nnodes/"
        "max_nnodes); empty for a run that is not elastic (absent from specs written before it existed).",
    )

    @model_validator(mode="before")
    @classmethod
    def _older_run_url(cls, data: Any) -> Any:
        """A spec.json written before `run` (tests/fixtures/compat-run): its `run_url`, reached with its config's
        run.storage_options."""
        if isinstance(data, dict) and "run_url" in data and "run" not in data:
            data = dict(data)
            config = data.get("config")
            options = config.get("run", {}).get("storage_options", {}) if isinstance(config, dict) else {}
            data["run"] = {"url": data.pop("run_url"), "options": options}
        return data

    @property
    def dataset_dir(self) -> Location:
        """The staged dataset (under run.storage, so reached with the run's options)."""
        return self.dataset.location(self.run)


def write_spec(spec: Spec) -> str:
    """Write spec.json into the run directory; returns the digest of its bytes."""
    data = write_json_atomic(join(spec.run, layout.SPEC), spec.model_dump(mode="json", by_alias=True))
    return digest_bytes(data, "sha256")


def load_spec(url: Location) -> tuple[Spec, str]:
    """(spec, sha256 of its bytes) from a spec.json URL, validated again."""
    try:
        raw = read_bytes(url)
    except FileNotFoundError:
        raise UserError(f"--spec {url}: no such file; pass the spec.json of a run") from None
    try:
        spec = Spec.model_validate_json(raw)
    except ValidationError as exc:
        raise UserError(
            f"{url}: not a valid {layout.SPEC_SCHEMA} document ({exc.error_count()} errors, "
            f"first: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']})"
        ) from None
    if spec.schema_name != layout.SPEC_SCHEMA:
        raise UserError(f"{url}: schema {spec.schema_name!r} is not {layout.SPEC_SCHEMA!r}")
    return spec, digest_bytes(raw, "sha256")


@dataclass(frozen=True)
class WrittenSpec:
    """A spec.json on storage: the spec, where it is, and the sha256 of its bytes (checked by every node)."""

    spec: Spec
    url: Location
    digest: str


def publish_spec(spec: Spec) -> WrittenSpec:
    """Write spec.json into the run directory and say where it is and what its bytes hash to."""
    return WrittenSpec(spec, join(spec.run, layout.SPEC), write_spec(spec))
