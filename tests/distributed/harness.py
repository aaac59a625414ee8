"""Run the real trainer under real torchrun agents (gloo, DeepSpeed on CPU) from tests, without Prefect.

The tiny model and the sample dataset are built once per session; each training run gets its own
run directory and a fresh rendezvous port.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from config.loader import load_config
from config.schema import FinetuneConfig
from config.sections.launch import LaunchConfig
from config.sections.run_data import RunConfig
from launch.backend import run_job
from launch.backends.local import LocalBackend
from launch.job import EVAL, TRAIN, PhaseJob
from pipeline.models import resolve_model
from pipeline.plan import build_spec, record_model
from staging.stage import stage_dataset
from storage import layout
from storage.fs import read_bytes
from storage.location import Location, join
from storage.spec import DatasetRef, Spec, WrittenSpec, load_spec, publish_spec

# Small and fast: 12 steps of 2 micro-batches x 2 examples per rank, a checkpoint every 4 steps.
BASE_OVERRIDES = [
    "train.max_steps=12",
    "train.save_steps=4",
    "train.micro_batch_size=2",
    "train.gradient_accumulation_steps=2",
    "train.learning_rate=0.003",
    "train.warmup_ratio=0.1",
    "train.lora.dropout=0.1",
    "train.log_steps=1",
    "data.max_length=128",
    "launch.rdzv_timeout=60",
]

# The elastic runs (tests/distributed/test_elastic.py, tests/chaos/test_lost_node.py): 16 steps of 12 rows, a checkpoint
# at 8 and 16, LoRA dropout 0. Global batch 12 divides into micro-batches of 2 on 1, 2 and 3 ranks (accumulation 6, 3
# and 2), so the trajectory depends on the seed, the step and the global batch alone.
ELASTIC = [
    "train.max_steps=16",
    "train.save_steps=8",
    "train.global_batch_size=12",
    "train.micro_batch_size=2",
    "train.lora.dropout=0",
]


@dataclass(frozen=True)
class Staged:
    """Storage (a path or URL) with the tiny model and the staged sample data."""

    storage: Path | str
    model_path: str
    dataset: DatasetRef
    options: dict[str, str] = field(default_factory=dict)  # run.storage_options (an object store's endpoint)

    @property
    def root(self) -> Location:
        """The storage with its options, as the pipeline reaches it."""
        return Location(str(self.storage), self.options)

    def run(self, name: str) -> Location:
        """The directory of run `name` under this storage (storage/layout.py's one definition)."""
        return layout.run_dir(RunConfig(storage=str(self.storage), storage_options=self.options), name)


@dataclass(frozen=True)
class Run:
    """One finished (or failed) training run."""

    spec: Spec
    spec_url: Location

    @property
    def run_dir(self) -> Path:
        return Path(self.spec.run.url)

    def losses(self) -> list[float]:
        return [r["loss"] for r in self.metrics() if "event" not in r]

    def metrics(self) -> list[dict]:
        text = read_bytes(join(self.spec.run, layout.METRICS)).decode()
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def checkpoint(self, step: int) -> Path:
        return Path(str(layout.checkpoint_dir(self.spec.run, step)))


def storage_settings(storage: Path | str, options: dict[str, str]) -> list[str]:
    """run.storage, and run.storage_options when there are any."""
    return [f"run.storage={storage}", *([f"run.storage_options={json.dumps(options)}"] if options else [])]


def stage(
    storage: Path | str, model: str = "tiny", overrides: list[str] = (), options: dict[str, str] | None = None
) -> Staged:
    """Stage the sample data (or `data.source` in `overrides`) under `storage` (reached with `options`, an object
    store's endpoint) for `model` (by default the tiny model, built under `storage`)."""
    options = options or {}
    cfg = load_config(
        None, [*storage_settings(storage, options), f"model.name_or_path={model}", *BASE_OVERRIDES, *overrides]
    )
    model_path = resolve_model(cfg)
    return Staged(storage, model_path, stage_dataset(cfg.data, layout.root(cfg.run), model_path), options)


def config(staged: Staged, name: str, overrides: list[str]) -> FinetuneConfig:
    """The test config: base overrides, then the test's own."""
    return load_config(
        None, [*storage_settings(staged.storage, staged.options), f"run.name={name}", *BASE_OVERRIDES, *overrides]
    )


def train(staged: Staged, name: str, overrides: list[str] = (), *, env: dict[str, str] | None = None) -> Run:
    """Write the spec and run `python -m trainer` on every node through the local backend (each node's preflight,
    claim and agent, progress and stalls followed); raises like the pipeline does."""
    cfg = config(staged, name, list(overrides))
    digest = record_model(cfg, name, staged.model_path)
    written = publish_spec(build_spec(cfg, name, staged.model_path, staged.dataset, digest))
    # `env` reaches the ranks as the job's own (PhaseJob.env), as a retry's transport debug levels do.
    run_job(LocalBackend(), PhaseJob(written, TRAIN, env=env or {}), lambda _: None, on_progress=lambda _: None)
    return Run(written.spec, written.url)


def eval_exported(run: Run) -> float:
    """The exported final/ model's eval loss (local or on S3) on the rows of the trainer's final evaluation
    (eval.final_eval_rows), computed in this process through the real loading path, from full logits: the trainer's
    final evaluation takes the chunked loss (train.loss_chunk_tokens), so the two agreeing is also the chunked
    evaluation agreeing with the unfused one."""
    import torch

    from storage.local_dataset import open_split
    from storage.node_cache import node_cache
    from trainer.data import sample_rows
    from trainer.evaluation.load import load_for_eval
    from trainer.model.load import ensure_pad_token_id
    from trainer.objectives.base import EvalOptions
    from trainer.objectives.sft import EvalRows, local_sums

    model = load_for_eval(layout.final_dir(run.spec.run), run.spec, torch.device("cpu"))
    split = open_split(run.spec.dataset_dir, "eval", node_cache(run.spec.config.launch))
    rows = EvalRows(sample_rows(len(split), run.spec.config.eval.final_eval_rows), 0, 1)
    options = EvalOptions(8, ensure_pad_token_id(model, run.spec.model_path))
    sums = local_sums(model, split, rows, options, torch.device("cpu"), 0)
    return sums[0] / sums[1]


# A conversation is about 294 tiny tokens (the tools block of the system turn alone ~220): packed, two to a row.
TOOL_CALL_DATA = ["data.max_length=600", "data.packing=true"]


def tool_call_conversations(n: int) -> list[dict]:
    """ShareGPT tool-calling records as LLaMA-Factory's glaive demo has them: a `tools` column (JSON text), the call
    as a `function_call` turn, its result as an `observation` turn, then the answer."""
    tools = json.dumps(
        [
            {
                "name": "add",
                "description": "Add two integers",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"],
                },
            }
        ]
    )
    return [
        {
            "tools": tools,
            "conversations": [
                {"from": "human", "value": f"What is {a} plus {b}?"},
                {"from": "function_call", "value": json.dumps({"name": "add", "arguments": {"a": a, "b": b}})},
                {"from": "observation", "value": str(a + b)},
                {"from": "gpt", "value": f"{a} plus {b} is {a + b}."},
            ],
        }
        for a, b in ((i, 3 * i + 7) for i in range(n))
    ]


def seconds_from_loss_to_resume(run_dir: Path, stamp: Path) -> float:
    """From the moment node 2's rank died (its EXIT_STAMP) to the survivors' trainer starting its steps (after its
    resume, when there was a checkpoint to resume from)."""
    line = [
        line
        for line in (run_dir / "nodes" / "0" / "log.txt").read_text().splitlines()
        if "trainer.loop: training" in line
    ][-1]
    logged = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000
    return logged - float(stamp.read_text())


def lost_node_pipeline(staged: Staged, name: str, died_at: int, tmp: Path) -> tuple[dict, Path, float]:
    """The whole pipeline on 3 local nodes with launch.min_nnodes=2, node 2 dying at step `died_at` and failing
    its preflight on every retry after (the TANDEM_TEST_LOST_NODE hook); returns (summary, run dir, seconds from
    the loss to training resuming)."""
    import pytest

    from flows.finetune import finetune

    lost, stamp = tmp / f"{name}-node-2-lost", tmp / f"{name}-died-at"
    cfg = config(
        staged,
        name,
        [
            *ELASTIC,
            f"model.name_or_path={staged.model_path}",
            "launch.nnodes=3",
            "launch.min_nnodes=2",
            "launch.retries=2",
            "launch.retry_delay_s=0",
        ],
    )
    faults = {
        "TANDEM_TEST_EXIT_AT_STEP": f"2:{died_at}",
        "TANDEM_TEST_EXIT_ONCE": str(lost),
        "TANDEM_TEST_EXIT_STAMP": str(stamp),
        "TANDEM_TEST_LOST_NODE": f"2:{lost}",
    }
    with pytest.MonkeyPatch.context() as patch:
        for key, value in faults.items():
            patch.setenv(key, value)
        summary = finetune(cfg)
    run_dir = Path(staged.storage) / "runs" / name
    return summary, run_dir, seconds_from_loss_to_resume(run_dir, stamp)


def evaluate(run: Run, model_url: str | Path, nproc: int) -> dict:
    """Run the evaluator on one node with `nproc` ranks, as the pipeline's evaluate task does; eval.json."""
    launch = LaunchConfig(nnodes=1, nproc_per_node=nproc, rdzv_timeout=60)
    # The ranks read the run's spec.json; only the launcher sees this world size (no preflight before eval).
    spec = run.spec.model_copy(update={"config": run.spec.config.model_copy(update={"launch": launch})})
    written = WrittenSpec(spec, run.spec_url, load_spec(run.spec_url)[1])
    run_job(LocalBackend(), PhaseJob(written, EVAL, spec.run.with_url(str(model_url))), lambda _: None)
    return json.loads((run.run_dir / "eval.json").read_text())
