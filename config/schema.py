"""The one typed description of a fine-tuning run: `FinetuneConfig`, assembled from its sections.

Defaults live in the sections (config/sections/: `base` for the `Section` base and the credential refusals,
`run_data`, `model_train`, `launch`, `results`) and nowhere else. Every section forbids unknown keys and is frozen,
so a typo in a preset or a `--set` override is an error that names the key, never a silently ignored value.
The same model is the Prefect flow's parameter, so the UI form is generated from these fields.

This module defines only what spans sections: the checks that read two of them, the batch and node arithmetic.
"""

from __future__ import annotations

import warnings

from pydantic import Field, model_validator

from config.batch import accumulation_steps, batch_problem
from config.objectives import PROMPT_DATA, SUPERVISED_DATA
from config.sections.base import Section
from config.sections.launch import LaunchConfig
from config.sections.model_train import DeepSpeedSection, ModelConfig, TrainConfig
from config.sections.results import (
    DELTA_PREFIX,
    REWARD_SCORES,
    TASK_METRICS,
    EvalConfig,
    RegisterConfig,
    TrackConfig,
)
from config.sections.run_data import PAIRS_UNPACKED, PROMPTS_UNPACKED, DataConfig, RunConfig
from config.sequence_parallel import layout_problem

# `register` is the section name users and scripts rely on; pydantic warns that BaseModel has a
# deprecated classmethod of that name, which this model never uses.
warnings.filterwarnings("ignore", message='Field name "register"', category=UserWarning)


GENERATE_PROMPTS = (
    "eval.generate with train.objective=grpo: its evaluation generates the eval prompts' answers and scores them with "
    "train.rl.rewards itself (eval.generate's max_records, batch_size and temperature apply); set "
    "eval.generate.enabled=false"
)
GENERATE_PREFERENCE = (
    "eval.generate needs supervised eval data (a prompt and its reference answer), not the preference rows of "
    "train.objective={name}: set eval.generate.enabled=false"
)


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
    def _pods_reach_storage(self) -> FinetuneConfig:
        """A pod sees an object store, or a path under the claim mounted at the same place on every pod."""
        if self.launch.backend != "kubernetes" or "://" in self.run.storage.removeprefix("file://"):
            return self
        kube = self.launch.kubernetes
        path = self.run.storage.removeprefix("file://")
        if kube.pvc is None or not (path + "/").startswith(kube.pvc_path.rstrip("/") + "/"):
            raise ValueError(
                f"run.storage={self.run.storage} is a path the pods cannot reach: with launch.backend=kubernetes use "
                "an object store (s3://...) or set launch.kubernetes.pvc to a ReadWriteMany claim and put run.storage "
                f"under launch.kubernetes.pvc_path ({kube.pvc_path}), where every pod and the pipeline mount it"
            )
        return self

    @model_validator(mode="after")
    def _elastic_batch(self) -> FinetuneConfig:
        low, high = self.node_range
        if not low <= self.launch.nnodes <= high:
            raise ValueError(
                f"launch.min_nnodes={low} <= launch.nnodes={self.launch.nnodes} <= launch.max_nnodes="
                f"{high} does not hold; set them in that order"
            )
        if self.launch.backend == "ssh" and high > self.launch.nnodes:
            raise ValueError(
                f"launch.max_nnodes={high}: the ssh backend's nodes are the {self.launch.nnodes} hosts of "
                "launch.hosts, and every attempt starts on those that answer; list the hosts there and "
                "leave launch.max_nnodes empty"
            )
        if low != high and self.train.global_batch_size is None:
            raise ValueError(
                "launch.min_nnodes/max_nnodes need train.global_batch_size (without it the batch, the "
                "schedule and the loss change with the number of nodes); set it, e.g. to today's "
                f"{self.global_batch(self.world_size)}"
            )
        if self.train.global_batch_size is not None:
            sizes = [self.readers(n * self.launch.nproc_per_node) for n in range(low, high + 1)]
            problem = batch_problem(self.train.global_batch_size, self.train.micro_batch_size, sizes)
            if problem:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _objective_data(self) -> FinetuneConfig:
        """The objective against the rest: the data it trains on (an empty data.preference becomes what it implies),
        the method, and the gate's metric."""
        objective = self.train.objective
        problems = (
            objective.data_problem(self.data.preference),
            objective.method_problem(self.train.method),
            self._gate_problem(),
            GENERATE_PREFERENCE.format(name=objective.name)
            if self.eval.generate.enabled and objective.data.preference_rows
            else None,
            GENERATE_PROMPTS if self.eval.generate.enabled and objective.data == PROMPT_DATA else None,
        )
        if found := next((problem for problem in problems if problem), None):
            raise ValueError(found)
        if self.data.preference is None:
            data = self.data.model_copy(update={"preference": objective.data.preference[0]})
            if data.preference == "pairs" and data.packing:
                raise ValueError(PAIRS_UNPACKED)
            if data.preference == "prompts" and data.packing:
                raise ValueError(PROMPTS_UNPACKED)
            # Sections are frozen: the config being validated takes its data section with the preference filled in,
            # so that staging, the dataset id, spec.json and --print-config all see the one the run stages with.
            object.__setattr__(self, "data", data)
        return self

    def _gate_problem(self) -> str | None:
        """Why register.gate cannot compare its metric for this run (None: it can)."""
        gate = self.register.gate
        if gate is None:
            return None
        metric = gate.metric.removeprefix(DELTA_PREFIX)
        if metric != gate.metric and not self.eval.compare_base:
            return f"register.gate.metric={gate.metric} compares with the base model: set eval.compare_base=true"
        if metric.startswith(TASK_METRICS):
            # Not held to the names: a group's subtasks (mmlu's mmlu_anatomy) have results of their own.
            if not self.eval.tasks.names:
                task = metric.split(".")[1]
                return f"register.gate.metric={gate.metric} is measured by eval.tasks: set eval.tasks.names=[{task}]"
            return None
        if not metric.startswith("generate."):
            return self.train.objective.gate_problem(metric)
        rl = self.train.objective.data == PROMPT_DATA
        if rl and (metric == "generate.reward" or metric.startswith(REWARD_SCORES)):
            names = [reward.name for reward in self.train.rl.parsed_rewards]
            name = metric.removeprefix(REWARD_SCORES)
            if metric.startswith(REWARD_SCORES) and name not in names:
                return f"register.gate.metric={gate.metric}: {name} is not one of train.rl.rewards ({', '.join(names)})"
            return None
        if rl or metric.startswith(REWARD_SCORES) or metric == "generate.reward":
            return (
                f"register.gate.metric={gate.metric} is not measured for train.objective={self.train.objective.name}; "
                + (
                    f"grpo's evaluation measures generate.reward and {REWARD_SCORES}<reward>"
                    if rl
                    else "the rewards are train.objective=grpo's"
                )
            )
        if not self.eval.generate.enabled:
            return f"register.gate.metric={gate.metric} is measured by eval.generate: set eval.generate.enabled=true"
        return None

    @model_validator(mode="after")
    def _rl(self) -> FinetuneConfig:
        """train.objective=grpo against the rest: the prompts' length is data.max_length, a record needs a reference
        answer when a reward reads one, and the global batch (completions) holds whole groups and whole rollout
        batches on every node count a launch may use."""
        if self.train.objective.data != PROMPT_DATA:
            return self
        rl, data = self.train.rl, self.data
        # Set, max_prompt_length is the length prompts are staged with (a preset's data.max_length gives way to it).
        length = rl.max_prompt_length or data.max_length
        answer = rl.needs_answer if data.require_answer is None else data.require_answer
        # Sections are frozen: filled in once here, so staging, spec.json and --print-config see the values used.
        object.__setattr__(self, "data", data.model_copy(update={"max_length": length, "require_answer": answer}))
        train = self.train.model_copy(update={"rl": rl.model_copy(update={"max_prompt_length": length})})
        object.__setattr__(self, "train", train)
        low, high = self.node_range
        for nodes in range(low, high + 1):
            batch = self.global_batch(nodes * self.launch.nproc_per_node)
            for size, name in ((rl.num_generations, "num_generations"), (rl.rollout_batch, "rollout_batch_size")):
                if batch % size:
                    raise ValueError(
                        f"train.objective=grpo: the global batch of {batch} completions on {nodes} node(s) "
                        f"(train.micro_batch_size x accumulation x ranks) is not a multiple of train.rl.{name}={size}; "
                        f"set train.global_batch_size to a multiple of it"
                    )
        return self

    @model_validator(mode="after")
    def _sequence_parallel(self) -> FinetuneConfig:
        """train.sequence_parallel_size against the world layout (every node count a launch may use) and the rest."""
        size = self.train.sequence_parallel_size
        if size == 1:
            return self
        per_node = self.launch.nproc_per_node
        low, high = self.node_range
        for problem in (layout_problem(size, n * per_node, per_node) for n in range(low, high + 1)):
            if problem:
                raise ValueError(problem)
        objective = self.train.objective
        if objective.data != SUPERVISED_DATA:
            raise ValueError(
                f"train.sequence_parallel_size={size}: train.objective={objective.name} is not split across ranks "
                "yet (only sft is); set train.sequence_parallel_size=1"
            )
        if self.train.micro_batch_size != 1:
            raise ValueError(
                f"train.sequence_parallel_size={size} needs train.micro_batch_size=1 (DeepSpeed's Ulysses fixes the "
                f"rows of a forward pass; long sequences take one row each), got {self.train.micro_batch_size}; "
                "raise train.gradient_accumulation_steps or train.global_batch_size instead"
            )
        if self.data.packing:
            raise ValueError(
                f"train.sequence_parallel_size={size} with data.packing=true: split sequences attend causally over "
                "the whole row (Ulysses drops the mask), across packed examples; set data.packing=false"
            )
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
        return accumulation_steps(
            train.global_batch_size, train.micro_batch_size, train.gradient_accumulation_steps, self.readers(world_size)
        )

    def global_batch(self, world_size: int) -> int:
        """Rows per optimizer step on `world_size` ranks."""
        return self.train.micro_batch_size * self.accumulation_steps(world_size) * self.readers(world_size)

    def batch_text(self, world_size: int) -> str:
        """The global batch as the log and the model card state it: rows = micro-batch x accumulation x readers."""
        readers, size = self.readers(world_size), self.train.sequence_parallel_size
        who = "ranks" if size == 1 else f"sequence groups of {size} ranks"
        return (
            f"{self.global_batch(world_size)} rows = {self.train.micro_batch_size} x "
            f"{self.accumulation_steps(world_size)} accumulation x {readers} {who}"
        )

    def readers(self, world_size: int) -> int:
        """Ranks that read different rows on `world_size` ranks: one a sequence group (config/sequence_parallel.py)."""
        return max(world_size // self.train.sequence_parallel_size, 1)
