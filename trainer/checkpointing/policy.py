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

from config.sections.model_train import size_in_bytes
from storage.checkpoints import CompleteCheckpoint, apply_retention
from storage.spec import Spec
from trainer.checkpointing.deepspeed_io import load_checkpoint, save_checkpoint
from trainer.checkpointing.export import export_final
from trainer.checkpointing.reshard import load_resharded
from trainer.checkpointing.resume import check_compatible, choose_checkpoint
from trainer.distributed import Dist

log = logging.getLogger(__name__)


class CheckpointIO(Protocol):
    """What the policy needs done to storage and to the model."""

    def find(self) -> CompleteCheckpoint | None:
        """The verified checkpoint to resume from (train.resume), or None."""

    def load(self, ckpt: CompleteCheckpoint) -> int:
        """Load it into the model; returns the step it holds."""

    def save(self, step: int) -> int:
        """Save a whole checkpoint of `step`; returns the bytes written."""

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
    """Resume, periodic saves with retention, the save on cancel, and the export, for one rank."""

    def __init__(self, io: CheckpointIO, policy: Policy, *, is_main: bool) -> None:
        self.io, self.policy, self.is_main = io, policy, is_main
        self.start = 0
        self.last_saved: int | None = None

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
        """After step `done`: when due (or `also`: train.save_every_minutes), save, `record` the checkpoint event
        (metrics.jsonl), then apply retention on rank 0; returns whether it saved."""
        if not (self.due(done) or also):
            return False
        self.last_saved = done
        started = time.perf_counter()
        size = self.io.save(done)
        record({"event": "checkpoint", "step": done, "bytes": size, "seconds": time.perf_counter() - started})
        if self.is_main:
            self.io.retain(self.policy.keep_latest_k)
        return True

    def cancelled(
        self,
        done: int,
        since_signal: float | None = None,
        grace_s: int | None = None,
        record: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """Stopping after `done` steps (SIGTERM): save them unless they are saved already (or nothing ran since
        resume), `record`ing the checkpoint event with `"reason": "sigterm"`. `since_signal`: seconds since this
        rank got the signal; the save is reported against `grace_s`."""
        if done > self.start and self.last_saved != done and not self.due(done):
            started = time.perf_counter()
            size = self.io.save(done)
            if record is not None:
                record(
                    {
                        "event": "checkpoint",
                        "step": done,
                        "bytes": size,
                        "seconds": time.perf_counter() - started,
                        "reason": "sigterm",
                    }
                )
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

    def finish(self) -> None:
        """Export the last step's model."""
        self.io.export(self.policy.total_steps)


class DeepSpeedIO:
    """CheckpointIO over a DeepSpeed engine and the run's checkpoints on storage."""

    def __init__(self, engine: Any, spec: Spec, dist: Dist, *, zero_stage: int) -> None:
        self.engine, self.spec, self.dist = engine, spec, dist
        train = spec.config.train
        self.zero_stage, self.method, self.adapters = zero_stage, train.method, train.method != "full"
        self.algorithm = spec.config.data.digest_algorithm  # writers use the configured digest

    def find(self) -> CompleteCheckpoint | None:
        ckpt = choose_checkpoint(self.spec.config.train.resume, self.spec.run, self.dist)
        if ckpt is not None:
            check_compatible(ckpt, zero_stage=self.zero_stage, method=self.method)
        return ckpt

    def load(self, ckpt: CompleteCheckpoint) -> int:
        if ckpt.manifest["world_size"] != self.dist.world_size:
            return load_resharded(
                self.engine,
                ckpt,
                self.dist,
                frozen_excluded=self.adapters,
                algorithm=self.algorithm,
                seed=self.spec.config.train.seed,
            )
        return load_checkpoint(self.engine, ckpt, self.dist, frozen_excluded=self.adapters)

    def save(self, step: int) -> int:
        _, size = save_checkpoint(
            self.engine,
            run_url=self.spec.run,
            step=step,
            meta={"zero_stage": self.zero_stage, "method": self.method},
            dist=self.dist,
            algorithm=self.algorithm,
            exclude_frozen=self.adapters,
        )
        return size

    def retain(self, keep_latest_k: int | None) -> None:
        apply_retention(self.spec.run, keep_latest_k)

    def export(self, step: int) -> None:
        export_final(
            self.engine,
            run_url=self.spec.run,
            model_path=self.spec.model_path,
            step=step,
            zero_stage=self.zero_stage,
            merged=self.spec.config.train.export_merged,
            shard_bytes=size_in_bytes(self.spec.config.train.export_shard_size),
            dist=self.dist,
            algorithm=self.algorithm,
            chat_template=self.spec.chat_template,
        )
