"""The one typed description of a fine-tuning run: `FinetuneConfig`.

Defaults live here and nowhere else. Every section forbids unknown keys and is frozen, so a typo in
a preset or a `--set` override is an error that names the key, never a silently ignored value.
The same model is the Prefect flow's parameter, so the UI form is generated from these fields.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from config.hosts import parse_host, read_hostfile
from config.redact import has_url_password, secret_keys

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Where credentials go instead of the config (the config is stored in spec.json, the Prefect database and logs).
ENV_FIX = ("set it in the environment of the launching process (each node's worker for launch.backend=prefect) and "
           "name it in launch.forward_env; the config holds names, never credentials")
STORAGE_FIX = ("give credentials through the environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, forwarded to the "
               "nodes with launch.forward_env) or a profile (AWS_PROFILE, ~/.aws/credentials), never the config")


def refuse_secrets(value: object, where: str, fix: str) -> object:
    """Refuse a mapping with a secret-looking key, naming the key (never its value) and where credentials go."""
    if isinstance(value, dict) and (found := secret_keys(value, where)):
        raise ValueError(f"{found[0]} looks like a credential: {fix}")
    return value


def refuse_url_password(value: object, where: str) -> object:
    """Refuse a URL that carries a password (https://user:password@host/...), naming the key, not the URL."""
    if isinstance(value, str) and has_url_password(value):
        raise ValueError(f"{where} has a password in its URL: remove it and {STORAGE_FIX}")
    return value

from config.batch import accumulation_steps, batch_problem


class Section(BaseModel):
    """Base for every config section: unknown keys are errors, values cannot change after load."""

    # hide_input_in_errors: a ValidationError's text (what Prefect logs when the UI form's parameters fail the flow's
    # validation) never quotes the refused value; the loader's own messages choose what to show (config/loader.py).
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)


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
COLUMN_NAMES = ("prompt", "query", "response", "history", "messages", "system", "tools")
# A source naming one entry of a LLaMA-Factory dataset_info.json: path/dataset_info.json#name.
CATALOG_ENTRY = re.compile(r"^(?P<path>.+\.json)#(?P<name>[^#/]+)$")
TAG_NAMES = ("role_tag", "content_tag", "user_tag", "assistant_tag", "observation_tag", "function_tag", "system_tag")


def check_mapping(value: dict[str, str], names: tuple[str, ...], where: str = "") -> dict[str, str]:
    """A columns/tags mapping whose keys are LLaMA-Factory's names (`where` prefixes the error: pydantic names the
    key itself)."""
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise ValueError(f"{where + ': ' if where else ''}unknown name {unknown[0]!r}; the names are LLaMA-Factory's: "
                         f"{', '.join(names)} "
                         "(images, audio and preference columns are not read: Tandem trains text models)")
    return value


def check_mapped_format(fmt: str, columns: dict[str, str], tags: dict[str, str], where: str) -> None:
    """A mapping renames the keys of one format: it needs that format named."""
    if (columns or tags) and fmt == "auto":
        raise ValueError(f"{where}.columns/tags rename the keys of one format: set {where}.format (alpaca, "
                         "sharegpt, openai, qwen or text) as well")


# The mappings' types: their keys are checked against LLaMA-Factory's names wherever they appear.
Columns = Annotated[dict[str, str], AfterValidator(lambda v: check_mapping(v, COLUMN_NAMES))]
Tags = Annotated[dict[str, str], AfterValidator(lambda v: check_mapping(v, TAG_NAMES))]


class SourceConfig(Section):
    """One source of data.sources: where its records are, how to read them, and its share of the mix."""

    source: str = Field(min_length=1, description="A file, directory, glob or fsspec URL, or a LLaMA-Factory "
                        "dataset_info.json entry (path/dataset_info.json#name).")
    format: FORMAT_NAMES = Field("auto", description="Record format of this source (as data.format).")
    columns: Columns = Field(default_factory=dict, description="As data.columns, for this source.")
    tags: Tags = Field(default_factory=dict, description="As data.tags, for this source.")
    weight: float | None = Field(None, gt=0, description="Share of this source with data.mix=interleave "
                                 "(default 1).")
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
        "auto", description="Record format of the data files; auto decides per file from its records. text: a "
        "'text' string per record, every token a target, the tokenizer's end-of-document token appended."
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
    max_length: int = Field(512, gt=0, le=1_048_576, description="Tokens per example; see data.excess_length.")
    eval_ratio: float = Field(0.1, ge=0.0, lt=1.0, description="Share of records held out for evaluation.")
    digest_algorithm: Literal["blake3", "sha256"] = Field("blake3", description="Digest for manifests.")
    shard_rows: int = Field(10_000, gt=0, le=10_000_000, description="Rows per Parquet shard (bounds shard size).")
    num_proc: int = Field(
        0, ge=0, le=256, description="Processes that parse, validate and digest (JSON Lines) and tokenize; 0: one per "
        "CPU core. Never changes the staged bytes."
    )
    enable_thinking: bool = Field(
        True,
        description="Reasoning models (Qwen3): true renders each assistant turn's reasoning_content where the chat "
        "template places it and trains it, and an empty reasoning block is a target; false drops reasoning_content "
        "and masks the empty block (the non-thinking mode's prompt). Passed to the template as enable_thinking.",
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
        "query, response, system, history (alpaca), messages, system, tools (sharegpt, openai, qwen), prompt (text). "
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
    def _shard_fits(self) -> DataConfig:
        # Shards store list offsets as int32: one shard may hold at most 2^31 - 1 tokens.
        if self.shard_rows * self.max_length >= 2**31:
            raise ValueError(f"data.shard_rows x data.max_length must stay below 2^31 tokens per shard, got "
                             f"{self.shard_rows} x {self.max_length}; lower data.shard_rows or data.max_length")
        return self


# Models Tandem builds itself (random weights, for tests and trying the pipeline): `tiny` has a small BPE trained
# on the sample data, `tiny-qwen2.5` Qwen's own BPE and vocabulary; both carry Qwen2.5's chat template.
BUILTIN_MODELS = ("tiny", "tiny-qwen2.5")


class ModelConfig(Section):
    """The base model."""

    name_or_path: str = Field("tiny", min_length=1, description="Local Hugging Face model directory, or a built-in "
                              "random Qwen2-shaped model: 'tiny' (small BPE) or 'tiny-qwen2.5' (Qwen's tokenizer).")
    chat_template: str | None = Field(
        None, min_length=1,
        description="Chat template to use instead of the tokenizer's own, for staging, training and the export: a "
        "built-in name (qwen2.5) or a Jinja file; empty: the model's own.",
    )


class LoraConfig(Section):
    """LoRA adapter settings (PEFT), used by train.method lora and qlora."""

    r: int = Field(8, gt=0, description="Adapter rank.")
    alpha: int = Field(16, gt=0, description="Scaling numerator (scale = alpha / r).")
    dropout: float = Field(0.05, ge=0.0, lt=1.0, description="Dropout on the adapter input.")
    target_modules: list[str] | None = Field(
        None,
        min_length=1,
        description="Module names that get adapters; empty: every attention and MLP projection of the "
        "model family (q/k/v/o/gate/up/down_proj for Qwen2/Llama/Mistral, c_attn/c_proj/w1/w2 for Qwen-1).",
    )


class TrainConfig(Section):
    """Optimisation. Defaults mirror Qwen's finetune_lora_ds.sh."""

    method: Literal["full", "lora", "qlora"] = Field("lora", description="Which parameters are trained.")
    learning_rate: float = Field(3e-4, gt=0.0, le=1.0, description="Peak learning rate.")
    max_steps: int | None = Field(None, gt=0, description="Optimizer steps to run; empty: from train.epochs.")
    epochs: float = Field(1.0, gt=0, le=1000, description="Passes over the train split, used when max_steps is empty.")
    save_steps: int = Field(1000, gt=0, description="Save a checkpoint every N steps (and at the end).")
    save_every_minutes: float | None = Field(
        None, gt=0, description="Also save when this many minutes passed since the last save (rank 0's clock, agreed "
        "by every rank at a step boundary); empty: by steps only. For spot machines, bounds the work a loss costs."
    )
    preempt_grace_s: int | None = Field(
        None, ge=1, le=30, description="On SIGTERM (a spot/preemptible machine's notice, sent to its torchrun agent), "
        "every rank stops at the next step boundary and saves an emergency checkpoint, which the retry resumes from; "
        "the save should finish within this many seconds (torchrun kills its ranks 30 s after forwarding the "
        "signal). Empty: SIGTERM stops without saving (unless launch.checkpoint_on_cancel)."
    )
    keep_latest_k: int | None = Field(
        None, ge=1, description="Keep only the newest k complete checkpoints; empty: keep all."
    )
    resume: str = Field(
        "auto",
        min_length=1,
        description="auto: continue from the run's newest complete checkpoint; never; or a checkpoint URL.",
    )
    export_merged: bool = Field(False, description="LoRA/Q-LoRA: also export base + adapter merged into full weights.")
    length_grouping: bool = Field(True, description="Group similar lengths into micro-batches (less padding).")
    straggler_check_steps: int = Field(10, gt=0, description="Compare per-rank step times every N steps.")
    straggler_factor: float = Field(
        1.5, gt=1.0, description="Warn when the slowest rank's step time exceeds the median by this factor."
    )
    micro_batch_size: int = Field(2, gt=0, description="Examples per rank per forward pass.")
    gradient_accumulation_steps: int = Field(
        8, gt=0, description="Micro-batches per rank per optimizer step; not used when train.global_batch_size is set."
    )
    global_batch_size: int | None = Field(
        None, gt=0, description="Rows per optimizer step across all ranks (packed rows when packing is on). When set, "
        "gradient accumulation is derived (global / (micro_batch_size x world size)), so the steps, the learning-rate "
        "schedule and the loss are the same on any number of nodes; needed to continue on fewer or more nodes."
    )
    weight_decay: float = Field(0.1, ge=0.0, description="AdamW weight decay.")
    adam_beta1: float = Field(0.9, gt=0.0, lt=1.0, description="AdamW beta1.")
    adam_beta2: float = Field(0.95, gt=0.0, lt=1.0, description="AdamW beta2.")
    adam_epsilon: float = Field(1e-8, gt=0.0, description="AdamW epsilon.")
    lr_scheduler: Literal["cosine", "linear"] = Field("cosine", description="Decay after warmup.")
    warmup_ratio: float = Field(0.01, ge=0.0, le=1.0, description="Share of max_steps spent warming up.")
    max_grad_norm: float = Field(1.0, gt=0.0, description="Gradient clipping norm.")
    seed: int = Field(42, ge=0, description="Base seed; rank r uses seed + r.")
    log_steps: int = Field(1, gt=0, description="Append to metrics.jsonl every N steps.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations to save memory.")
    loss_chunk_tokens: int = Field(
        1024, ge=0, description="The loss (training and evaluation) applies the output layer to this many target "
        "tokens at a time and recomputes them in backward, so the full-vocabulary logits never exist at once "
        "(trainer/chunked_loss.py); 0: the model's full logits. Qwen2, Qwen3, Llama, Mistral and Gemma models only "
        "(others use full logits); under ZeRO-2 and ZeRO-3 alike."
    )
    lora: LoraConfig = Field(default_factory=LoraConfig)


class DeepSpeedSection(Section):
    """DeepSpeed engine configuration."""

    config: str = Field("config/deepspeed/zero2.json", min_length=1,
                        description="DeepSpeed JSON (ours or Qwen's, 'auto' values allowed; resolved from train).")


class LaunchConfig(Section):
    """How torchrun reaches every node."""

    backend: Literal["local", "prefect", "slurm", "ssh"] = Field(
        "local",
        description="local: every node is a torchrun agent on this machine; prefect: one node flow run per node, "
        "on work queue {queue_prefix}{rank}, served by a process worker on that node; slurm: one sbatch job; "
        "ssh: `python -m flows.node` on every host of launch.hosts / launch.hostfile over OpenSSH.",
    )
    queue_prefix: str = Field("node-", min_length=1, description="prefect backend: node r's work queue is prefix + r.")
    node_deployment: str = Field("node/node", min_length=3, description="prefect backend: the per-node deployment.")
    slurm_args: list[str] = Field(
        default_factory=list, description="slurm backend: extra #SBATCH options, e.g. --partition=gpu, --time=24:00:00."
    )
    nnodes: int = Field(2, gt=0, le=1024, description="Number of nodes.")
    min_nnodes: int | None = Field(
        None, gt=0, le=1024, description="A retry after a lost node continues on the nodes that pass preflight when "
        "at least this many do (from the newest complete checkpoint, same train.global_batch_size); empty: "
        "launch.nnodes (every node must come back)."
    )
    max_nnodes: int | None = Field(
        None, gt=0, le=1024, description="Upper bound of the nodes a retry may use (local backend: nodes it may add "
        "when more hosts are free); empty: launch.nnodes."
    )
    nproc_per_node: int = Field(1, gt=0, le=64, description="Ranks per node (GPUs per node).")
    hosts: list[str] = Field(
        default_factory=list, description="ssh backend: the nodes, node 0 first: host, user@host or host:port "
        "(ssh's port). They decide launch.nnodes."
    )
    hostfile: str | None = Field(
        None, description="ssh backend, when launch.hosts is empty: a file of hosts, `host slots=N` per line "
        "(DeepSpeed/OpenMPI) or one line per slot (a PBS/Torque node file: $PBS_NODEFILE); it decides launch.nnodes "
        "and launch.nproc_per_node. The hosts read are recorded in launch.hosts."
    )
    remote_root: str | None = Field(
        None, description="ssh backend: the Tandem checkout on the hosts; empty: the same path as on this machine."
    )
    remote_python: str | None = Field(
        None, description="ssh backend: the Python on the hosts; empty: the same path as this process's."
    )
    ssh_options: list[str] = Field(
        default_factory=list, description="ssh backend: extra ssh options, e.g. -i ~/.ssh/cluster or "
        "-oProxyJump=bastion (BatchMode, a connect timeout and connection sharing are always set)."
    )
    ssh_connect_timeout: int = Field(10, gt=0, le=300, description="ssh backend: seconds to connect to a host.")
    master_addr: str | None = Field(
        None, min_length=1, description="Rendezvous host (node 0's address); empty: the first of launch.hosts "
        "(ssh backend), else 127.0.0.1."
    )
    master_port: int | None = Field(
        None, ge=1024, le=65535, description="Rendezvous port; empty: a free port is picked per launch."
    )
    rdzv_timeout: int = Field(120, gt=0, description="Seconds to wait for every node to join.")
    collective_timeout: int = Field(
        1800, gt=0, description="Seconds a rank may wait in one collective (all-reduce, barrier) before the job "
        "fails. Must exceed the longest checkpoint save, during which the other ranks wait at a barrier; "
        "hangs are caught sooner by launch.stall_timeout, lost nodes within seconds by the agents."
    )
    retries: int = Field(
        0, ge=0, le=20, description="Retry training this many times after a retryable failure (lost node, stall, "
        "rendezvous timeout); each retry resumes from the newest complete checkpoint. Bad config/data is not retried."
    )
    retry_delay_s: int = Field(10, ge=0, description="Seconds between a failure and its retry.")
    checkpoint_on_cancel: bool = Field(
        False, description="When the run is cancelled, save a checkpoint at the next step boundary before stopping."
    )
    cancel_grace_s: int = Field(
        30, ge=1, le=3600, description="Seconds ranks get to stop (and save) after a cancel before they are "
        "killed (torchrun itself kills its ranks 30 s after forwarding the signal)."
    )
    stall_timeout: int = Field(
        600, gt=0, description="Stop the job when no optimizer step completes for this many seconds (a step "
        "that saves a checkpoint includes the save: keep it above the longest save)."
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment for every rank (NCCL_*, GLOO_*), stored with the run; "
        "no credentials (see forward_env)."
    )
    forward_env: list[str] = Field(
        default_factory=list, description="Names of environment variables (credentials: HF_TOKEN, "
        "AWS_SECRET_ACCESS_KEY, ...) every node's agent and ranks get from the environment that starts the node; "
        "values never enter the config. Preflight fails on a node where one is not set."
    )

    @field_validator("env", mode="before")
    @classmethod
    def _no_credentials(cls, value: object) -> object:
        return refuse_secrets(value, "launch.env", ENV_FIX)

    @field_validator("forward_env")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        bad = [name for name in names if not re.match(ENV_NAME, name)]
        if bad:
            raise ValueError(f"launch.forward_env: {bad[0]!r} is not an environment variable name (letters, digits, "
                             "_; not starting with a digit)")
        if twice := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(f"launch.forward_env: {twice[0]} is listed twice")
        return names

    @model_validator(mode="after")
    def _env_or_forwarded(self) -> LaunchConfig:
        if both := sorted(set(self.env) & set(self.forward_env)):
            raise ValueError(f"launch.env.{both[0]} is also in launch.forward_env; keep it in one place")
        return self
    probe_mb: float = Field(
        4.0, ge=0, le=1024, description="Megabytes of the network probe before training (an all-reduce over every "
        "rank and a send/receive between each node and node 0, both ways); 0 turns it off."
    )
    min_bandwidth_gbps: float = Field(
        1.0, ge=0, description="Warn (or fail, with launch.require_bandwidth) when the probe measures less than "
        "this many Gbit/s (Qwen's guide asks for 10+ between GPU nodes)."
    )
    require_bandwidth: bool = Field(
        False, description="Fail before training when the probe measures less than launch.min_bandwidth_gbps."
    )

    @model_validator(mode="before")
    @classmethod
    def _hosts_decide_the_shape(cls, data: object) -> object:
        """With the ssh backend the hosts decide nnodes (and, from a host file, nproc_per_node)."""
        if not isinstance(data, dict) or data.get("backend") != "ssh":
            return data
        return resolve_ssh_hosts(dict(data))

    @property
    def rendezvous_addr(self) -> str:
        """Where node 0's rendezvous listens: launch.master_addr, else the first host (ssh), else 127.0.0.1."""
        if self.master_addr:
            return self.master_addr
        if self.backend == "ssh" and self.hosts:
            return parse_host(self.hosts[0], "launch.hosts[0]").host
        return "127.0.0.1"


def resolve_ssh_hosts(data: dict) -> dict:
    """Fill nnodes / nproc_per_node / hosts of an ssh launch section from launch.hosts or launch.hostfile; a value
    set explicitly that contradicts the hosts is an error naming both."""
    hosts = data.get("hosts") or []
    if isinstance(hosts, str):
        hosts = [h for h in hosts.replace(",", " ").split() if h]
    if hosts:
        parsed = [parse_host(str(h), f"launch.hosts[{i}]") for i, h in enumerate(hosts)]
        slots = None
    elif data.get("hostfile"):
        found = read_hostfile(str(data["hostfile"]))
        parsed = [host for host, _ in found]
        if len({n for _, n in found}) > 1:
            raise ValueError(f"launch.hostfile {data['hostfile']}: hosts have different slot counts "
                             f"({', '.join(f'{h} slots={n}' for h, n in found)}); every node runs the same number "
                             "of ranks: give each host the same slots")
        slots = found[0][1]
    else:
        raise ValueError("launch.backend=ssh needs launch.hosts (host, user@host or host:port, node 0 first) or "
                         "launch.hostfile (e.g. $PBS_NODEFILE)")
    if len({h.host for h in parsed}) < len(parsed):
        raise ValueError(f"launch.hosts lists a host twice ({', '.join(map(str, parsed))}); one entry per node")
    names = ", ".join(map(str, parsed))
    if "nnodes" in data and int(data["nnodes"]) != len(parsed):
        raise ValueError(f"launch.nnodes={data['nnodes']} contradicts the {len(parsed)} ssh hosts ({names}); "
                         "drop launch.nnodes (the hosts decide it) or fix the hosts")
    if slots is not None and "nproc_per_node" in data and int(data["nproc_per_node"]) != slots:
        raise ValueError(f"launch.nproc_per_node={data['nproc_per_node']} contradicts launch.hostfile "
                         f"(slots={slots} per host); drop launch.nproc_per_node or fix the host file")
    data["hosts"] = [str(h) for h in parsed]
    data["nnodes"] = len(parsed)
    if slots is not None:
        data["nproc_per_node"] = slots
    return data


class EvalConfig(Section):
    """Evaluation of the trained model on the eval split."""

    batch_size: int = Field(8, gt=0, description="Examples per rank per forward pass.")
    model: Literal["final", "checkpoint"] = Field(
        "final",
        description="What the pipeline evaluates: the exported final/ model, or the final complete checkpoint "
        "(DeepSpeed shards, reassembled on the base model).",
    )
    generate_samples: int = Field(
        0, ge=0, le=1000, description="Write this many greedy completions of eval prompts to {run}/samples.jsonl."
    )
    max_new_tokens: int = Field(32, gt=0, le=4096, description="Tokens generated per sample (eval.generate_samples).")


Metric = Literal["loss", "perplexity", "token_accuracy"]
# Which way each metric improves; a gate pointing the other way would promote worse models.
METRIC_DIRECTION: dict[str, str] = {"loss": "min", "perplexity": "min", "token_accuracy": "max"}
# How the champion is chosen when register.gate is not set.
CHAMPION_METRIC: Metric = "loss"


class GateConfig(Section):
    """Promotion gate: register only when the eval metric passes a threshold or beats the champion."""

    metric: Metric = Field("loss", description="Eval metric the gate compares (and the champion is ranked by).")
    direction: Literal["min", "max"] = Field("min", description="min: lower is better; max: higher is better.")
    threshold: float | None = Field(
        None, description="Pass when the metric is at most (min) or at least (max) this value."
    )
    better_than: Literal["champion"] | None = Field(
        None, description="champion: pass only when strictly better than the current champion (or none exists)."
    )

    @model_validator(mode="after")
    def _one_rule(self) -> GateConfig:
        if (self.threshold is None) == (self.better_than is None):
            raise ValueError("set exactly one of register.gate.threshold and register.gate.better_than")
        if self.direction != METRIC_DIRECTION[self.metric]:
            raise ValueError(f"register.gate.direction must be {METRIC_DIRECTION[self.metric]} for {self.metric}, "
                             f"got {self.direction}")
        return self


class RegisterConfig(Section):
    """Where the trained model is registered, and the gate it must pass."""

    model_name: str = Field(
        "tandem-tiny",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$",
        description="Registry name; versions are registry/{model_name}/v0001.json, v0002.json, ...",
    )
    gate: GateConfig | None = Field(
        None, description="Promotion gate; empty: every evaluated model is registered."
    )


MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"
TRACKING_OFF = "off"


class TrackConfig(Section):
    """Where the run's metrics, parameters and models are mirrored: MLflow, TensorBoard, Weights & Biases.

    Tandem's own files (metrics.jsonl, the registry) stay the source of truth; the pipeline process forwards them."""

    mlflow_uri: str | None = Field(
        None,
        description=f"MLflow tracking server (http://host:5000) or store URI; empty: ${MLFLOW_URI_ENV} when set, "
        f"else no MLflow; {TRACKING_OFF}: no MLflow even when ${MLFLOW_URI_ENV} is set. Credentials come from "
        "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD, never from here.",
        min_length=1,
    )
    mlflow_experiment: str = Field(
        "tandem", min_length=1, max_length=500, description="MLflow experiment the run is logged to (created if new)."
    )
    tensorboard: bool = Field(False, description="Write TensorBoard event files under {run}/tensorboard/.")
    wandb: bool = Field(False, description="Log to Weights & Biases (WANDB_API_KEY / WANDB_MODE from the environment).")
    wandb_project: str = Field("tandem", min_length=1, max_length=128, description="W&B project of the run.")

    @field_validator("mlflow_uri", mode="before")
    @classmethod
    def _no_url_password(cls, value: object) -> object:
        if value is False:  # `--set track.mlflow_uri=off` is YAML, where a bare off is false
            return TRACKING_OFF
        if isinstance(value, str) and has_url_password(value):
            raise ValueError("track.mlflow_uri has a password in its URL: remove it and set MLFLOW_TRACKING_USERNAME "
                             "and MLFLOW_TRACKING_PASSWORD in the environment instead")
        return value

    def mlflow_tracking_uri(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The MLflow URI this run logs to, or None when MLflow is off (the rule of track.mlflow_uri)."""
        if self.mlflow_uri == TRACKING_OFF:
            return None
        if self.mlflow_uri is not None:
            return self.mlflow_uri
        return (os.environ if environ is None else environ).get(MLFLOW_URI_ENV) or None


# `register` is the section name users and scripts rely on; pydantic warns that BaseModel has a
# deprecated classmethod of that name, which this model never uses.
warnings.filterwarnings("ignore", message='Field name "register"', category=UserWarning)


class FinetuneConfig(Section):
    """A whole fine-tuning run: prepare, train, evaluate, register."""

    run: RunConfig = Field(default_factory=RunConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    deepspeed: DeepSpeedSection = Field(default_factory=DeepSpeedSection)
    launch: LaunchConfig = Field(default_factory=LaunchConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    register: RegisterConfig = Field(default_factory=RegisterConfig)
    track: TrackConfig = Field(default_factory=TrackConfig)

    @model_validator(mode="after")
    def _retries_resume(self) -> FinetuneConfig:
        if self.launch.retries and self.train.resume == "never":
            raise ValueError("launch.retries needs train.resume=auto (a retry continues from the newest checkpoint)")
        return self

    @model_validator(mode="after")
    def _elastic_batch(self) -> FinetuneConfig:
        low, high = self.node_range
        if not low <= self.launch.nnodes <= high:
            raise ValueError(f"launch.min_nnodes={low} <= launch.nnodes={self.launch.nnodes} <= launch.max_nnodes="
                             f"{high} does not hold; set them in that order")
        if (low, high) != (self.launch.nnodes, self.launch.nnodes) and self.launch.backend != "local":
            raise ValueError(f"launch.min_nnodes/max_nnodes: only launch.backend=local picks the surviving nodes so "
                             f"far, not {self.launch.backend}; leave them empty (every node must come back)")
        if low != high and self.train.global_batch_size is None:
            raise ValueError("launch.min_nnodes/max_nnodes need train.global_batch_size (without it the batch, the "
                             "schedule and the loss change with the number of nodes); set it, e.g. to today's "
                             f"{self.global_batch(self.world_size)}")
        if self.train.global_batch_size is not None:
            sizes = [n * self.launch.nproc_per_node for n in range(low, high + 1)]
            problem = batch_problem(self.train.global_batch_size, self.train.micro_batch_size, sizes)
            if problem:
                raise ValueError(problem)
        return self

    @property
    def node_range(self) -> tuple[int, int]:
        """(launch.min_nnodes, launch.max_nnodes) with their defaults: the node counts a launch may use."""
        return self.launch.min_nnodes or self.launch.nnodes, self.launch.max_nnodes or self.launch.nnodes

    @property
    def world_size(self) -> int:
        """Total ranks across all nodes."""
        return self.launch.nnodes * self.launch.nproc_per_node

    def accumulation_steps(self, world_size: int) -> int:
        """Micro-batches per rank per optimizer step on `world_size` ranks (derived from train.global_batch_size
        when it is set)."""
        train = self.train
        return accumulation_steps(train.global_batch_size, train.micro_batch_size, train.gradient_accumulation_steps,
                                  world_size)

    def global_batch(self, world_size: int) -> int:
        """Rows per optimizer step on `world_size` ranks."""
        return self.train.micro_batch_size * self.accumulation_steps(world_size) * world_size

