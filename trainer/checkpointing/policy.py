"""The trainer's checkpoint policy, in the manner of torchtitan's CheckpointManager: resume, the save interval,
the save on cancel, retention and the export, owned by one object so that `train()` is the step loop.

The policy (which step saves, what a cancel saves, when retention runs, what resume returns) is plain Python over
a `CheckpointIO`; `DeepSpeedIO` is the one that touches an engine. Tests drive the policy with a fake IO.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from config.sections.model_train import size_in_bytes
from storage.checkpoints import CompleteCheckpoint, apply_retention
from storage.spec import Spec
from trainer.checkpointing.deepspeed_io import Saving, begin_save, load_checkpoint, objective_state
from trainer.checkpointing.export import ExportSettings, export_final
from trainer.checkpointing.reshard import check_sequence_groups, load_resharded
from trainer.checkpointing.resume import check_compatible, choose_checkpoint
from trainer.checkpointing.snapshot import SnapshotEngine
from trainer.checkpointing.writer import BackgroundSave, SaveResult
from trainer.parallel.distributed import Dist, dist_sum, side_group
from trainer.watch.faults import Faults

log = logging.getLogger(__name__)


class InFlight(Protocol):
    """A save that was started: trainer/checkpointing/writer.py's BackgroundSave."""

    @property
    def step(self) -> int:
        """The step it saves."""

    def done(self) -> bool:
        """Whether it finished (never blocks)."""

    def wait(self, timeout: float | None = None) -> SaveResult | None:
        """Its result (None: `timeout` passed first); raises its error."""


class Carried(Protocol):
    """What a checkpoint keeps of the objective beside the engine (trainer/objectives/base.py)."""

    def state_dict(self) -> dict[str, Any] | None:
        """Its state now (None: nothing)."""
        ...

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Its state from a checkpoint."""
        ...


class CheckpointIO(Protocol):
    """What the policy needs done to storage and to the model."""

    def find(self) -> CompleteCheckpoint | None:
        """The verified checkpoint to resume from (train.resume), or None."""

    def load(self, ckpt: CompleteCheckpoint) -> int:
        """Load it into the model; returns the step it holds."""

    def start_save(self, step: int) -> InFlight:
        """Save `step`: the part training waits for now, the rest in the background (or all of it now when
        train.async_save is off). Collective."""

    def agree(self, mine: bool) -> bool:
        """Whether every rank says True. Collective."""

    def retain(self, keep_latest_k: int | None) -> None:
        """Apply retention (called on rank 0 only)."""

    def export(self, step: int) -> None:
        """Export the model of `step` to final/."""


@dataclass(frozen=True)
class Policy:
    """train.save_steps, the run's last step, train.keep_latest_k."""

    save_steps: int
    total_steps: int
    keep_latest_k: int | None


class Checkpointer:
    """Resume, periodic saves with retention, the save on cancel, and the export, for one rank. At most one save is
    in flight: a new one waits for the last; its `checkpoint` event (metrics.jsonl) and retention follow its
    COMPLETE, seen at a step boundary."""

    def __init__(self, io: CheckpointIO, policy: Policy, *, is_main: bool) -> None:
        self.io, self.policy, self.is_main = io, policy, is_main
        self.start = 0
        self.last_saved: int | None = None
        self.in_flight: InFlight | None = None
        self.started_at = 0.0  # of the save in flight (perf_counter, which every thread shares)
        self.blocked_s = 0.0  # what training waited for, of the save in flight
        self._emergency: int | None = None  # the step a SIGTERM saved

    def resume(self) -> int:
        """The step to start from: that of the checkpoint train.resume picks (loaded), else 0."""
        ckpt = self.io.find()
        if ckpt is not None:
            self.start = self.last_saved = self.io.load(ckpt)
        return self.start

    def due(self, done: int) -> bool:
        """Whether the state after `done` steps is saved: every save_steps, and the last step."""
        return done % self.policy.save_steps == 0 or done == self.policy.total_steps

    def step_done(self, done: int, record: Callable[[dict[str, Any]], None], *, also: bool = False) -> bool:
        """After step `done`: note a finished save (`record` its checkpoint event, then retention on rank 0); when
        due (or `also`: train.save_every_minutes), start a save; returns whether it started one."""
        self.poll(record)
        if not (self.due(done) or also):
            return False
        self._start(done, record)
        return True

    def poll(self, record: Callable[[dict[str, Any]], None]) -> None:
        """If the save in flight finished: record it and apply retention (raises its writer's error)."""
        if self.in_flight is not None and self.in_flight.done():
            self.wait(record)

    def wait(self, record: Callable[[dict[str, Any]], None], timeout: float | None = None) -> bool:
        """Wait for the save in flight (at most `timeout` s); returns whether none is left in flight."""
        if self.in_flight is None:
            return True
        result = self.in_flight.wait(timeout)
        if result is None:
            return False
        self.in_flight = None
        if result.complete:
            record(
                {
                    "event": "checkpoint",
                    "step": result.step,
                    "bytes": result.bytes,
                    "seconds": result.finished_at - self.started_at,
                    "blocked_s": self.blocked_s,
                    **({"reason": "sigterm"} if result.step == self._emergency else {}),
                }
            )
            if self.is_main:
                self.io.retain(self.policy.keep_latest_k)
        return True

    def _start(self, done: int, record: Callable[[dict[str, Any]], None]) -> None:
        self.wait(record)  # at most one save in flight
        self.started_at = time.perf_counter()
        self.in_flight = self.io.start_save(done)
        self.blocked_s = time.perf_counter() - self.started_at
        self.last_saved = done
        self.poll(record)  # a synchronous save is done already

    def cancelled(
        self,
        done: int,
        since_signal: float | None = None,
        grace_s: int | None = None,
        record: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """Stopping after `done` steps (SIGTERM): let the save in flight finish within what is left of `grace_s`
        (else leave it without COMPLETE), then save `done` unless it is saved already (or nothing ran since resume),
        and wait for that save. `since_signal`: seconds since this rank got the signal (None: a peer got it)."""
        record = record if record is not None else (lambda _: None)
        left = None if since_signal is None or grace_s is None else max(0.0, grace_s - since_signal)
        # Every rank must agree: a new save while a writer is still running would share its group of writers.
        if not self.io.agree(self.wait(record, left)):
            log.warning(
                "stopped by SIGTERM after step %d: the save of step %s did not finish within "
                "train.preempt_grace_s=%s and is left without COMPLETE",
                done,
                self.last_saved,
                grace_s,
            )
            return
        if done > self.start and self.last_saved != done and not self.due(done):
            self._emergency = done
            self._start(done, record)
            self.wait(record)
        if since_signal is None or grace_s is None:
            log.warning("stopped by SIGTERM after step %d with a complete checkpoint", done)
            return
        if since_signal > grace_s:
            log.warning(
                "stopped by SIGTERM after step %d: its checkpoint completed %.1f s after the signal, past "
                "train.preempt_grace_s=%d; save more often (train.save_every_minutes) or shorten steps",
                done,
                since_signal,
                grace_s,
            )
        else:
            log.warning(
                "stopped by SIGTERM after step %d: emergency checkpoint complete %.1f s after the signal "
                "(train.preempt_grace_s=%d)",
                done,
                since_signal,
                grace_s,
            )

    def finish(self, record: Callable[[dict[str, Any]], None]) -> None:
        """Wait for the last save, then export the last step's model."""
        self.wait(record)
        self.io.export(self.policy.total_steps)


class DeepSpeedIO:
    """CheckpointIO over a DeepSpeed engine and the run's checkpoints on storage."""

    def __init__(
        self, engine: Any, spec: Spec, dist: Dist, faults: Faults, *, zero_stage: int, carried: Carried | None = None
    ) -> None:
        self.engine, self.spec, self.dist, self.faults = engine, spec, dist, faults
        self.carried = carried  # the objective, whose own state a checkpoint keeps beside the engine's
        train = spec.config.train
        self.zero_stage, self.method, self.adapters = zero_stage, train.method, train.method.trains_adapters
        self.algorithm = spec.config.data.digest_algorithm  # writers use the configured digest
        # Every checkpoint file's digest is in its manifest and checked on resume; the zip CRC32 that torch.save
        # computes for each record is a second check that costs as much CPU as the write itself.
        torch.serialization.set_crc32_options(False)
        background = train.async_save
        self.snapshots = SnapshotEngine(dist.local_world) if background else None
        self.writers = side_group(dist) if background else None  # collective: every rank builds the IO

    def find(self) -> CompleteCheckpoint | None:
        ckpt = choose_checkpoint(self.spec.config.train.resume, self.spec.run, self.dist)
        if ckpt is not None:
            check_compatible(ckpt, zero_stage=self.zero_stage, method=self.method)
            check_sequence_groups(ckpt.manifest, self.dist)
        return ckpt

    def load(self, ckpt: CompleteCheckpoint) -> int:
        if ckpt.manifest["world_size"] != self.dist.world_size:
            step = load_resharded(
                self.engine,
                ckpt,
                self.dist,
                frozen_excluded=self.adapters,
                algorithm=self.algorithm,
                seed=self.spec.config.train.seed,
            )
        else:
            step = load_checkpoint(self.engine, ckpt, self.dist, frozen_excluded=self.adapters)
        if self.carried is not None:
            self.carried.load_state_dict(objective_state(ckpt))
        return step

    def start_save(self, step: int) -> InFlight:
        meta = {
            "zero_stage": self.zero_stage,
            "method": self.method.name,
            "sequence_parallel_size": self.dist.sequence_parallel,
        }
        kept = self.carried.state_dict() if self.carried is not None else None
        saving = Saving(
            self.spec.run, self.dist, self.algorithm, self.adapters, meta, self.snapshots, self.faults, kept
        )
        job = begin_save(self.engine, step, saving)
        return BackgroundSave(job, self.dist, self.writers, background=self.snapshots is not None)

    def agree(self, mine: bool) -> bool:
        (yes,) = dist_sum([1.0 if mine else 0.0], self.dist)
        return yes == self.dist.world_size

    def retain(self, keep_latest_k: int | None) -> None:
        apply_retention(self.spec.run, keep_latest_k)

    def export(self, step: int) -> None:
        if self.snapshots is not None:
            self.snapshots.release()
        settings = ExportSettings(
            self.spec.run,
            self.spec.model_path,
            self.zero_stage,
            self.spec.config.train.export_merged,
            size_in_bytes(self.spec.config.train.export_shard_size),
            self.algorithm,
            self.spec.chat_template,
            self.spec.config.model.trust_remote_code,
        )
        export_final(self.engine, step, settings, self.dist, self.faults)
