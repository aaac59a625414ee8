"""Where a run's bytes are and where its records come from: the `run` section (run id, `run.storage` and its fsspec
options) and the `data` section (sources, formats, LLaMA-Factory column/tag mappings, staging limits).

Together because both hold fsspec URLs and storage options, which refuse credentials the same way; the mapping names
and `CATALOG_ENTRY` live here too, beside the fields they check (the staging library reuses them).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from config.sections.base import STORAGE_FIX, Section, refuse_secrets, refuse_url_password

# data.preference: what staging does with preference data (staging/preference.py).
PreferenceMode = Literal["refuse", "chosen", "pairs", "prompts"]
# data.preference where it is empty and no objective implies one (a data section on its own, as staging's tests make):
# supervised data, preference data refused. A run's config fills an empty one in from train.objective instead.
SUPERVISED_PREFERENCE: PreferenceMode = "refuse"
MAX_LENGTH = 1_048_576  # data.max_length's upper bound (the memory plan's search stops there too)
PAIRS_UNPACKED = "data.packing: preference data is not packed (a pair is one row); leave data.packing empty or false"
PROMPTS_UNPACKED = "data.packing: prompts are not packed (a prompt is one row); leave data.packing empty or false"


class RunConfig(Section):
    """Where the run lives and what it is called."""

    name: str | None = Field(
        None,
        description="Run id. Setting it makes the run resumable by name; empty: a new id per run.",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$",
    )
    storage: str = Field(
        ".tandem/storage",
        description="fsspec URL shared by every node: a local/NFS path or s3://bucket/prefix.",
        min_length=1,
    )
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        description="Extra fsspec options for run.storage (e.g. endpoint_url for MinIO); credentials come from the "
        "AWS environment or profile, never from here.",
    )
    take_over: bool = Field(
        False,
        description="Rerunning a run.name whose pipeline died (its lock not yet expired): take the run over at once "
        "instead of waiting for the lock's lease to expire; refused while the old pipeline is provably alive (its "
        "process on this host, or a lock renewed within half a lease).",
    )

    @field_validator("storage_options", mode="before")
    @classmethod
    def _no_credentials(cls, value: object) -> object:
        return refuse_secrets(value, "run.storage_options", STORAGE_FIX)

    @field_validator("storage", mode="before")
    @classmethod
    def _no_url_password(cls, value: object) -> object:
        return refuse_url_password(value, "run.storage")


FORMAT_NAMES = Literal["auto", "qwen", "sharegpt", "openai", "alpaca", "text"]
# LLaMA-Factory's names for the keys of a record (dataset_info.json `columns`) and for the roles of its turns
# (`tags`): the mapping says under which key of the user's data each one is.
COLUMN_NAMES = (
    "prompt",
    "query",
    "response",
    "history",
    "messages",
    "system",
    "tools",
    "chosen",
    "rejected",
    "kto_tag",
    "images",
)
# A source naming one entry of a LLaMA-Factory dataset_info.json: path/dataset_info.json#name.
CATALOG_ENTRY = re.compile(r"^(?P<path>.+\.json)#(?P<name>[^#/]+)$")
TAG_NAMES = ("role_tag", "content_tag", "user_tag", "assistant_tag", "observation_tag", "function_tag", "system_tag")


def check_mapping(value: dict[str, str], names: tuple[str, ...], where: str = "") -> dict[str, str]:
    """A columns/tags mapping whose keys are LLaMA-Factory's names (`where` prefixes the error: pydantic names the
    key itself)."""
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise ValueError(
            f"{where + ': ' if where else ''}unknown name {unknown[0]!r}; the names are LLaMA-Factory's: "
            f"{', '.join(names)} "
            "(videos and audios columns are not read: Tandem trains on text and images)"
        )
    return value


def check_mapped_format(fmt: str, columns: dict[str, str], tags: dict[str, str], where: str) -> None:
    """A mapping renames the keys of one format: it needs that format named."""
    if (columns or tags) and fmt == "auto":
        raise ValueError(
            f"{where}.columns/tags rename the keys of one format: set {where}.format (alpaca, "
            "sharegpt, openai, qwen or text) as well"
        )


# The mappings' types: their keys are checked against LLaMA-Factory's names wherever they appear.
Columns = Annotated[dict[str, str], AfterValidator(lambda v: check_mapping(v, COLUMN_NAMES))]
Tags = Annotated[dict[str, str], AfterValidator(lambda v: check_mapping(v, TAG_NAMES))]


class SourceConfig(Section):
    """One source of data.sources: where its records are, how to read them, and its share of the mix."""

    source: str = Field(
        min_length=1,
        description="A file, directory, glob or fsspec URL, or a LLaMA-Factory "
        "dataset_info.json entry (path/dataset_info.json#name).",
    )
    format: FORMAT_NAMES = Field("auto", description="Record format of this source (as data.format).")
    columns: Columns = Field(default_factory=dict, description="As data.columns, for this source.")
    tags: Tags = Field(default_factory=dict, description="As data.tags, for this source.")
    weight: float | None = Field(None, gt=0, description="Share of this source with data.mix=interleave (default 1).")
    max_records: int | None = Field(None, gt=0, description="Take at most this many valid records of this source.")

    @model_validator(mode="after")
    def _mapped_format(self) -> SourceConfig:
        check_mapped_format(self.format, self.columns, self.tags, "data.sources[]")
        return self


class DataConfig(Section):
    """The training data and how it is turned into token shards (tokenized once, in the prepare step)."""

    source: str = Field(
        "data/sample/conversations.json",
        description="Training data: a file, a directory, a glob or any fsspec URL (s3://bucket/prefix/*.jsonl); "
        "JSON array, JSONL or Parquet files.",
        min_length=1,
    )
    format: FORMAT_NAMES = Field(
        "auto",
        description="Record format of the data files; auto decides per file from its records. text: a "
        "'text' string per record, every token a target, the tokenizer's end-of-document token appended.",
    )
    eval_source: str | None = Field(
        None,
        min_length=1,
        description="Explicit eval data (same forms as data.source). When set, every record of data.source trains "
        "and data.eval_ratio is not used.",
    )
    on_invalid: Literal["fail", "skip"] = Field(
        "fail",
        description="fail: the first invalid record stops with its location; skip: invalid records go to "
        "rejects.jsonl next to the manifest, counted in it.",
    )
    max_length: int = Field(512, gt=0, le=MAX_LENGTH, description="Tokens per example; see data.excess_length.")
    eval_ratio: float = Field(
        0.1,
        ge=0.0,
        lt=1.0,
        description="Share of records held out for evaluation, by record digest: of 2 or more records at least one "
        "and at most the share rounded up (10 records at 0.1: one).",
    )
    eval_max_records: int | None = Field(
        2000,
        gt=0,
        description="The most records data.eval_ratio holds out: of the records that fall into eval, those with the "
        "lowest digests stay there (a function of the records, not of their order) and the others train; null: no "
        "cap. With the defaults, datasets up to about 20,000 records are split by the ratio alone. Not applied to "
        "data.eval_source, which is evaluated whole.",
    )
    digest_algorithm: Literal["blake3", "sha256"] = Field("blake3", description="Digest for manifests.")
    shard_rows: int = Field(10_000, gt=0, le=10_000_000, description="Rows per shard (bounds shard size).")
    num_proc: int = Field(
        0,
        ge=0,
        le=256,
        description="Processes that parse, validate and digest (JSON Lines) and tokenize; 0: one per "
        "CPU core. Never changes the staged bytes.",
    )
    enable_thinking: bool = Field(
        True,
        description="Reasoning models (Qwen3): true renders each assistant turn's reasoning_content where the chat "
        "template places it and trains it, and an empty reasoning block is a target; false drops reasoning_content "
        "and masks the empty block (the non-thinking mode's prompt). Passed to the template as enable_thinking.",
    )
    preference: PreferenceMode | None = Field(
        None,
        description="Preference data, detected in every source: pairs (a 'chosen' and a 'rejected' answer, or "
        "'chosen_messages'/'rejected_messages') and KTO feedback (a boolean 'label' or 'kto_tag'). refuse: staging "
        "stops with a line naming the file, its columns and the form found. chosen: supervised training on the "
        "desirable side only: a pair's prompt and chosen answer (the rejected answer is never a target), and KTO "
        "records labelled true; records labelled false are not staged, but listed in rejects.jsonl and counted as "
        "undesirable in the manifest. pairs: staged as preference rows for a preference train.objective (a pair: "
        "its prompt once, the chosen and the rejected answer; KTO feedback: its prompt, its answer and the label); "
        "a record that is not preference data is rejected. prompts: online RL's prompts (train.objective=grpo): "
        "GSM8K's question and answer, OpenR1-Math's problem, solution and answer, or TRL's prompt (a text or a list of "
        "messages), each staged as its prompt rendered by the chat template with the generation prompt, and its other "
        "columns kept for the reward functions. Empty: what train.objective trains on (refuse for sft, pairs for dpo, "
        "ipo, kto and orpo, prompts for grpo); a setting that contradicts train.objective is refused.",
    )
    require_answer: bool | None = Field(
        None,
        description="data.preference=prompts: a record without a reference answer (an 'answer' or 'solution' "
        "column) is invalid (data.on_invalid says what then). Empty: required when train.rl.rewards has accuracy.",
    )
    mask_history: bool = Field(
        False, description="Train only the last assistant turn of each conversation; earlier turns are context."
    )
    storage_options: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="Extra fsspec options for reading data.source and data.eval_source (e.g. endpoint_url, anon); "
        "credentials come from the AWS environment or profile, never from here.",
    )
    excess_length: Literal["truncate", "drop", "fail"] = Field(
        "truncate",
        description="An example longer than data.max_length: truncate keeps whole turns that fit (or, when the first "
        "trained turn alone does not, the end of its prompt and the start of its answer); drop leaves it out, counted "
        "and listed in rejects.jsonl; fail stops with its location.",
    )
    columns: Columns = Field(
        default_factory=dict,
        description="Where the format's fields are in records whose keys differ, by LLaMA-Factory's names: prompt, "
        "query, response, system, history (alpaca), messages, system, tools, images (sharegpt, openai, qwen), prompt "
        "(text); "
        "for preference data (see data.preference) chosen, rejected and kto_tag (alpaca, sharegpt, openai, qwen). "
        "Example: {prompt: question, response: answer}. Needs data.format.",
    )
    tags: Tags = Field(
        default_factory=dict,
        description="The keys and role names of turns, by LLaMA-Factory's names: role_tag, content_tag, user_tag, "
        "assistant_tag, observation_tag, function_tag, system_tag. Example: {role_tag: role, content_tag: content, "
        "user_tag: user, assistant_tag: assistant}. Needs data.format.",
    )
    sources: list[SourceConfig] | None = Field(
        None,
        min_length=1,
        description="Several sources mixed, each with its own format, mapping, weight and cap; when set, "
        "data.source is not used, and data.format, data.columns and data.tags apply to data.eval_source only.",
    )
    mix: Literal["concat", "interleave"] = Field(
        "concat",
        description="How data.sources are mixed: concat (one after the other, in order) or interleave (records "
        "taken in turn by weight, stopping when the first source runs out, like LLaMA-Factory's interleave_under).",
    )
    image_max_pixels: int = Field(
        768 * 768,
        gt=0,
        description="Vision-language models: an image larger than this many pixels is scaled down (its aspect ratio "
        "kept) before it is cut into patches, as Qwen's processor's max_pixels does; with image_min_pixels it decides "
        "each image's tokens, counted at staging (LLaMA-Factory's image_max_pixels and default).",
    )
    image_min_pixels: int = Field(
        32 * 32,
        gt=0,
        description="Vision-language models: an image smaller than this many pixels is scaled up (Qwen's min_pixels; "
        "LLaMA-Factory's image_min_pixels and default).",
    )
    packing: bool | None = Field(
        None,
        description="Pack several examples into each row of data.max_length tokens at prepare time (first-fit "
        "decreasing; each example attends only to itself and its positions restart at 0). Unset: on when every input "
        "is plain text (format text, from data.format, data.sources, a dataset_info.json entry or detected), off for "
        "chat data. A global batch counts rows, packed or not.",
    )

    @field_validator("sources", mode="before")
    @classmethod
    def _no_source_password(cls, value: object) -> object:
        # Here rather than in SourceConfig: the message names the source's index, and no value is echoed.
        for index, item in enumerate(value if isinstance(value, list) else []):
            source = item.get("source") if isinstance(item, dict) else getattr(item, "source", None)
            refuse_url_password(source, f"data.sources[{index}].source")
        return value

    @model_validator(mode="after")
    def _mapped_format(self) -> DataConfig:
        check_mapped_format(self.format, self.columns, self.tags, "data")
        return self

    @field_validator("storage_options", mode="before")
    @classmethod
    def _no_credentials(cls, value: object) -> object:
        return refuse_secrets(value, "data.storage_options", STORAGE_FIX)

    @field_validator("source", "eval_source", mode="before")
    @classmethod
    def _no_url_password(cls, value: object, info: ValidationInfo) -> object:
        return refuse_url_password(value, f"data.{info.field_name}")

    @model_validator(mode="after")
    def _image_pixels(self) -> DataConfig:
        if self.image_min_pixels > self.image_max_pixels:
            raise ValueError(
                f"data.image_min_pixels ({self.image_min_pixels}) must not exceed data.image_max_pixels "
                f"({self.image_max_pixels}); lower the first or raise the second"
            )
        return self

    @model_validator(mode="after")
    def _pairs_unpacked(self) -> DataConfig:
        if self.preference == "pairs" and self.packing:
            raise ValueError(PAIRS_UNPACKED)
        if self.preference == "prompts" and self.packing:
            raise ValueError(PROMPTS_UNPACKED)
        return self

    @property
    def preference_mode(self) -> PreferenceMode:
        """data.preference as staging applies it: as set, or as train.objective implies it (a run's config fills an
        empty one in: config/schema.py); a data section on its own, with no objective, refuses preference data."""
        return self.preference or SUPERVISED_PREFERENCE

    @model_validator(mode="after")
    def _shard_fits(self) -> DataConfig:
        # Shards store list offsets as int32: one shard may hold at most 2^31 - 1 tokens.
        if self.shard_rows * self.max_length >= 2**31:
            raise ValueError(
                f"data.shard_rows x data.max_length must stay below 2^31 tokens per shard, got "
                f"{self.shard_rows} x {self.max_length}; lower data.shard_rows or data.max_length"
            )
        return self
