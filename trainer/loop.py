"""The training loop: the run built (trainer/build.py), the run's objective (trainer/objectives/) one optimizer step
at a time (trainer/step.py), metrics, the watches (trainer/watch/); checkpoints and the export through the
checkpointer (trainer/checkpointing/policy.py).

    train       build, start (resume), every step, finish
    start_run   the engine, the objective, the checkpointer, the data's order, the watches, the step prefetch
    run_step    cancel, faults, the step under the out-of-memory guard, the loss guard, metrics, a checkpoint
    finish      the final evaluation on the in-memory model, the last save and the export
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from config.sections.model_train import TrainConfig
from storage.spec import Spec
from storage.split_reader import Split
from trainer.build import Built, build_engine, seed_everything
from trainer.checkpointing.policy import Checkpointer, DeepSpeedIO
from trainer.checkpointing.policy import Policy as SavePolicy
from trainer.data import Dealing, GlobalOrder, sample_rows, split_of
from trainer.metrics import MetricsWriter, StepStats, peak_device_memory
from trainer.objectives.base import EvalOptions, Metrics, TrainObjective, check_rows
from trainer.objectives.policy import Policy
from trainer.objectives.registry import build
from trainer.parallel import sequence_parallel
from trainer.parallel.distributed import Dist
from trainer.prefetch import StepPrefetcher
from trainer.step import StepTools, optimizer_step
from trainer.watch import guards
from trainer.watch.cancel import EXIT_CANCELLED, CancelWatch, SaveClock
from trainer.watch.faults import Faults
from trainer.watch.heartbeat import Heartbeat
from trainer.watch.profiler import StepProfiler
from trainer.watch.straggler import StragglerWatch

log = logging.getLogger(__name__)


@dataclass
class Watches:
    """What watches the steps: stragglers, heartbeats, a cancel (SIGTERM), the wall-clock saves, the profiler."""

    straggler: StragglerWatch
    heartbeat: Heartbeat
    cancel: CancelWatch
    clock: SaveClock
    profiler: StepProfiler

    @classmethod
    def of(cls, spec: Spec, dist: Dist, start: int) -> Watches:
        """The run's watches, from train and launch's settings."""
        train = spec.config.train
        return cls(
            StragglerWatch(train.straggler_check_steps, train.straggler_factor, dist),
            Heartbeat(dist.rank),
            CancelWatch(spec.config.launch.checkpoint_on_cancel or bool(train.preempt_grace_s)),
            SaveClock(train.save_every_minutes),
            StepProfiler(train.profile_steps, start, spec.total_steps, spec.run, dist.rank),
        )


@dataclass
class Run:
    """What the step loop works with besides the spec: the built engine, the objective, the rows and their order,
    the metrics, the watches, the checkpointer, the step prefetch, and the first step (after a resume)."""

    spec: Spec
    dist: Dist
    faults: Faults
    built: Built
    objective: TrainObjective[Any, Any, Any]
    examples: Split
    order: GlobalOrder
    checkpointer: Checkpointer
    start: int
    metrics: MetricsWriter = field(init=False)
    watches: Watches = field(init=False)
    prefetch: StepPrefetcher = field(init=False)
    policy: Policy = field(init=False)
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.metrics = MetricsWriter(self.spec.run, enabled=self.dist.is_main, start_step=self.start)
        self.watches = Watches.of(self.spec, self.dist, self.start)
        self.prefetch = StepPrefetcher(self.deal, self.spec.total_steps, pin=self.dist.device.type == "cuda")
        self.policy = Policy(self.built.engine, self.dist.device, self.built.router)

    @property
    def train(self) -> TrainConfig:
        """The run's train section."""
        return self.spec.config.train

    def deal(self, step: int) -> list[Any]:
        """This rank's micro-batches of optimizer step `step` (0-based), each cut to its part with sequence
        parallelism; the prefetch's worker calls it a step ahead."""
        dealing = Dealing(
            step,
            self.train.micro_batch_size,
            self.spec.config.accumulation_steps(self.dist.world_size),
            self.dist.data_rank,  # the ranks of a sequence group read the same rows, each its part of them
            self.dist.data_world,
            self.built.pad_id,
            self.train.length_grouping,
            self.built.images,  # a vision-language model's images, read in the prefetch's worker
        )
        return [sequence_parallel.shard(b, self.dist) for b in self.objective.deal(self.examples, self.order, dealing)]


def train(spec: Spec, dist: Dist, faults: Faults) -> None:
    """Run the spec's optimizer steps (resuming if asked), logging, checkpointing and exporting."""
    dist = sequence_parallel.start(spec, dist)
    run = start_run(spec, dist, faults)
    for step in range(run.start, spec.total_steps):
        run_step(run, step)
    finish(run)


def start_run(spec: Spec, dist: Dist, faults: Faults) -> Run:
    """Build the engine and the objective, resume (train.resume), and set up the rows, metrics and the watches."""
    train_cfg = spec.config.train
    objective = build(train_cfg)
    examples = split_of(spec, "train")
    check_rows(examples, objective.objective)  # before the model loads: rows staged for another objective stop here
    built = build_engine(spec, dist, faults)
    objective.start(built, spec, dist)  # by the base (a reference table): before any checkpoint is resumed
    seed_everything(train_cfg.seed + dist.rank)  # per-rank streams (dropout); restored on resume
    io = DeepSpeedIO(built.engine, spec, dist, faults, zero_stage=built.choices.zero_stage, carried=objective)
    checkpointer = Checkpointer(
        io, SavePolicy(train_cfg.save_steps, spec.total_steps, train_cfg.keep_latest_k), is_main=dist.is_main
    )
    start = checkpointer.resume()
    order = GlobalOrder(len(examples), train_cfg.seed)
    order.epoch(start * spec.config.global_batch(dist.world_size) // max(len(examples), 1))  # before the first step
    run = Run(spec, dist, faults, built, objective, examples, order, checkpointer, start)
    log.info(
        "training %d rows (%d examples) with %s, steps %d..%d on %d ranks",
        len(examples),
        examples.examples,
        objective.objective,
        start + 1,
        spec.total_steps,
        dist.world_size,
    )
    return run


def run_step(run: Run, step: int) -> None:
    """Optimizer step `step` (0-based) with everything around it: a cancel first, a test's fault, the profiler, the
    step, the loss guard, the straggler watch, its metrics.jsonl line and a checkpoint when due."""
    spec, dist, watches, done = run.spec, run.dist, run.watches, step + 1
    if watches.cancel.should_stop(dist):
        run.checkpointer.cancelled(
            step, watches.cancel.seconds_since_signal(), run.train.preempt_grace_s, run.metrics.write
        )
        raise SystemExit(EXIT_CANCELLED)
    if run.faults.fires_at(dist.rank, done):
        run.checkpointer.wait(run.metrics.write)
    run.faults.at_step(dist.rank, done)
    watches.profiler.before(done)
    started = time.perf_counter()
    with guards.out_of_memory_named(dist, done):
        stats, extra, data_s = one_step(run, step)
    elapsed = time.perf_counter() - started
    if step == run.start and run.train.compile:
        log.info("train.compile: the first step took %.1f s, compiling the decoder layers included", elapsed)
    watches.profiler.after(done, run.metrics.write)
    guards.check_loss(stats.loss, done)
    watches.straggler.observe(stats.compute_s)
    for event in watches.straggler.check(done):
        run.metrics.write(event)
    if done % run.train.log_steps == 0 or done == spec.total_steps:
        record = step_record(run.built.engine, stats, (done, spec.total_steps), elapsed, data_s) | extra
        if watches.profiler.profiles(done):
            record["profiled"] = True  # its time includes the profiler's
        run.metrics.write({**record, "elapsed_s": time.perf_counter() - run.started})
    if run.checkpointer.step_done(done, run.metrics.write, also=watches.clock.due(dist)):
        watches.clock.saved()


def one_step(run: Run, step: int) -> tuple[StepStats, dict[str, float], float]:
    """Optimizer step `step` (0-based) of the objective: (its stats, the objective's own step metrics, this rank's
    seconds waiting for its rows to be read and batched: dealt while the step before ran, it is near 0)."""
    started = time.perf_counter()
    batches = run.prefetch.batches(step)
    data_s = time.perf_counter() - started
    tools = StepTools(run.dist, run.watches.heartbeat, run.faults)
    stats, extra = optimizer_step(run.built.engine, run.policy, batches, run.objective, tools, step + 1)
    return stats, extra, data_s


def step_record(engine: Any, stats: StepStats, steps: tuple[int, int], elapsed: float, data_s: float) -> dict[str, Any]:
    """The metrics.jsonl line of a logged step (`steps`: (done, total); `data_s`: this rank's time to read and batch
    the step's rows)."""
    done, total = steps
    return {
        "step": done,
        "max_steps": total,
        "loss": stats.loss,
        "lr": engine.get_lr()[0],
        "grad_norm": float(engine.get_global_grad_norm() or 0.0),
        "target_tokens": stats.target_tokens,
        "tokens": stats.tokens,
        "tokens_per_s": stats.tokens / elapsed,
        "step_time_s": elapsed,
        "data_time_s": data_s,
        "padding_fraction": stats.padding_fraction,
        **peak_device_memory(),
    }


def finish(run: Run) -> None:
    """After the last step: the final evaluation (when this process trained), the last save, and the export."""
    run.prefetch.close()
    if run.start < run.spec.total_steps:
        result = final_eval(run)
        run.metrics.write({"event": "final_eval", "step": run.spec.total_steps, **result})
    run.checkpointer.finish(run.metrics.write)


def final_eval(run: Run) -> Metrics:
    """The objective's eval metrics of the in-memory trained model on eval.final_eval_rows rows of the eval split (the
    exported model must reproduce them on the same rows: trainer/data.py `sample_rows`)."""
    engine, eval_cfg = run.built.engine, run.spec.config.eval
    engine.eval()
    examples = split_of(run.spec, "eval")
    rows = sample_rows(len(examples), eval_cfg.final_eval_rows)
    options = EvalOptions(eval_cfg.batch_size, run.built.pad_id, run.built.choices.zero3, run.built.images)
    result = run.objective.evaluate(engine, examples, rows, run.dist, options)
    engine.train()
    return result
