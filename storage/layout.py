"""Names of everything Tandem writes on storage, in one place (see docs/architecture.md, "On storage")."""

from __future__ import annotations

from config.sections.run_data import RunConfig
from storage.location import Location, join

DATASET_SCHEMA = "tandem.dataset/1"
# A dataset with images (vision-language records): its manifest lists them and its shards name them, which readers
# before it would not see; they refuse this schema rather than train on the text alone.
IMAGE_DATASET_SCHEMA = "tandem.dataset/2"
DATASET_SCHEMAS = (DATASET_SCHEMA, IMAGE_DATASET_SCHEMA)
CHECKPOINT_SCHEMA = "tandem.checkpoint/1"
SPEC_SCHEMA = "tandem.spec/1"
EVAL_SCHEMA = "tandem.eval/1"
REGISTRY_SCHEMA = "tandem.registry/1"
MODEL_SCHEMA = "tandem.model/1"
CHAMPION_SCHEMA = "tandem.champion/1"
MIRROR_SCHEMA = "tandem.mlflow-mirror/1"
SAMPLES_SCHEMA = "tandem.samples/1"
BASE_EVAL_SCHEMA = "tandem.base-eval/1"
UNIVERSAL_SCHEMA = "tandem.universal/1"
BASE_MODEL_SCHEMA = "tandem.base-model/1"
BASE_MODEL = "base_model.json"  # {run}/base_model.json: the base model's files, sizes and digests

MANIFEST = "manifest.json"
REJECTS = "rejects.jsonl"
DATASET_INDEX_SCHEMA = "tandem.dataset-index/1"
COMPLETE = "COMPLETE"
SPEC = "spec.json"
METRICS = "metrics.jsonl"
EVAL = "eval.json"
SAMPLES = "samples.jsonl"
LOSS_PLOT = "loss.png"
MODEL_CARD = "model_card.md"
ADAPTERS = "adapters.json"  # {run}/final/adapters.json: what a LoRA run adapted (storage/adapters.py)
TENSORBOARD = "tensorboard"  # {run}/tensorboard/: event files of the TensorBoard sink
CHAMPION = "champion.json"
LOG = "log.txt"
STATUS = "status.json"
NODES = "nodes"
PREFLIGHT = "preflight.json"
LOCK = "LOCK"
LOCK_SCHEMA = "tandem.run-lock/1"
SPLITS = ("train", "eval")
IMAGES = "images"  # {dataset}/images/{digest}.{ext}: a dataset's images, one file per distinct image
SHARD_SUFFIX = ".arrow"  # a shard: an Arrow IPC file (storage/shards.py)
PARQUET_SHARD_SUFFIX = ".parquet"  # a shard of a dataset staged before the Arrow form (read through the node cache)


def root(run: RunConfig) -> Location:
    """run.storage, reached with run.storage_options: everything the pipeline writes is under it."""
    return Location(run.storage, run.storage_options)


def run_dir(run: RunConfig, run_id: str) -> Location:
    """{run.storage}/runs/{run_id}, reached with run.storage_options: the one definition of a run's directory. The
    plan puts it in spec.json (`Spec.run`), where every node and rank finds it."""
    return join(root(run), "runs", run_id)


def dataset_dir(storage: Location, dataset_id: str) -> Location:
    """{storage}/datasets/{dataset_id}"""
    return join(storage, "datasets", dataset_id)


def dataset_index(storage: Location, source_key: str) -> Location:
    """{storage}/datasets/by-source/{key}.json: which dataset id unchanged sources and settings staged to."""
    return join(storage, "datasets", "by-source", f"{source_key}.json")


def shard_name(split: str, index: int) -> str:
    """Path of a tokenized shard, relative to its dataset directory."""
    return f"{split}/shard-{index:05d}{SHARD_SUFFIX}"


def image_path(name: str) -> str:
    """Path of a staged image (named `{digest}.{ext}`), relative to its dataset directory."""
    return f"{IMAGES}/{name}"


def base_eval_url(storage: Location, key: str) -> Location:
    """{storage}/eval-cache/base/{key}.json: the base model's evaluation (eval.compare_base), shared by every run of
    the same base model, eval data and evaluation settings (trainer/evaluation/base_model.py `cache_key`)."""
    return join(storage, "eval-cache", "base", f"{key}.json")


def reward_file_url(storage: Location, digest: str, filename: str) -> Location:
    """{storage}/rewards/{sha256, 16 hex}/{filename}: a reward function's file (train.rl.rewards), staged with the data
    and named by its digest, so every node runs the same bytes (storage/rewards.py)."""
    return join(storage, "rewards", digest[:16], filename)


def model_dir(storage: Location, name: str) -> Location:
    """{storage}/models/{name}: base models materialized by Tandem (the built-in tiny model)."""
    return join(storage, "models", name)


def run_lock_url(run: Location) -> Location:
    """{run}/LOCK: the lease of the one pipeline running this run (see storage/run_lock.py)."""
    return join(run, LOCK)


def node_dir(run: Location, node_rank: int) -> Location:
    """{run}/nodes/{node_rank}"""
    return join(run, NODES, str(node_rank))


def checkpoints_dir(run: Location) -> Location:
    """{run}/checkpoints"""
    return join(run, "checkpoints")


def checkpoint_dir(run: Location, step: int) -> Location:
    """{run}/checkpoints/step-{step:08d}"""
    return join(run, "checkpoints", f"step-{step:08d}")


def rank_dir_name(rank: int) -> str:
    """rank-{rank:05d}: one rank's shard directory inside a checkpoint."""
    return f"rank-{rank:05d}"


def universal_dir(checkpoint: Location) -> Location:
    """{checkpoint}/universal: the checkpoint converted to DeepSpeed's universal (world-size free) form, with its
    own manifest and COMPLETE; deleted with its checkpoint."""
    return join(checkpoint, "universal")


def final_dir(run: Location) -> Location:
    """{run}/final: the exported model."""
    return join(run, "final")


def registry_dir(storage: Location, model: str) -> Location:
    """{storage}/registry/{model}"""
    return join(registry_root(storage), model)


def registry_root(storage: Location) -> Location:
    """{storage}/registry"""
    return join(storage, "registry")


def registry_entry_name(version: int) -> str:
    """v{n:04d}.json"""
    return f"v{version:04d}.json"


def mirror_url(storage: Location, model: str, version: int) -> Location:
    """{storage}/registry/{model}/mlflow/v{n:04d}.json: how version n is mirrored in MLflow's model registry."""
    return join(registry_dir(storage, model), "mlflow", registry_entry_name(version))


def champion_url(storage: Location, model: str) -> Location:
    """{storage}/registry/{model}/champion.json: the alias naming the best version."""
    return join(registry_dir(storage, model), CHAMPION)


# Set by the launcher for every rank of a node: where its ranks touch their heartbeat files.
HEARTBEAT_ENV = "TANDEM_HEARTBEAT_DIR"
# ... and the address of this node's interface that routes to node 0 (how the network probe names a node).
NODE_ADDR_ENV = "TANDEM_NODE_ADDR"
# ... and "1", which tells a process it is a rank: the trainer package then keeps MLflow out
# (trainer/model/lean_imports.py).
RANK_PROCESS_ENV = "TANDEM_RANK_PROCESS"
