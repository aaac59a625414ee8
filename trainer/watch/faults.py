"""Test-only fault injection: a `Faults` value, read once from the environment when a rank starts
(`Faults.from_environment`, in trainer/harness.py) and handed to the parts it reaches (the step loop, the optimizer
step, the model's build, the checkpoint writer, the export). In production no variable is set and the value is
`NO_FAULTS`, whose every hook does nothing; nothing reads the environment per step or per micro-batch. They let tests
make a rank slow or die at a chosen step through the real entry point, instead of mocking the trainer.

    TANDEM_TEST_SLOW_RANK=RANK:SECONDS   sleep SECONDS per micro-batch on global rank RANK
    TANDEM_TEST_EXIT_AT_STEP=RANK:STEP   hard-exit global rank RANK when it reaches optimizer step STEP (this and the
                                         other step hooks below first let a background save in flight finish)
    TANDEM_TEST_SIGNAL_AT_STEP=RANK:STEP send TANDEM_TEST_SIGNAL (a name: KILL by default, SEGV, BUS, ABRT) to global
                                         rank RANK itself when it reaches optimizer step STEP: a real death by signal,
                                         as the kernel's out-of-memory killer or a native crash brings it
    TANDEM_TEST_STALL_AT_STEP=RANK:STEP  hang global rank RANK (sleep for an hour) in optimizer step STEP
    TANDEM_TEST_EXIT_IN_SAVE=RANK:STEP:POINT
                                         hard-exit global rank RANK while it saves the checkpoint of step STEP, at
                                         POINT: `mid_upload` (its files are written, one of them is on storage),
                                         `after_shard` (its own shard files are written, the manifest is not)
                                         or `before_complete` (rank 0 only: manifest.json written and checked,
                                         COMPLETE not yet) — the moments a crash must not leave a usable
                                         half-checkpoint
    TANDEM_TEST_SLOW_SAVE=SECONDS        sleep SECONDS on every rank right after its shard is written (a slow
                                         store), so that a test can act while a checkpoint is half written
    TANDEM_TEST_HOLD_SAVE=PATH           every rank's checkpoint writer waits, after its shard is written, until PATH
                                         exists (at most 10 minutes), so that a test sees training go on meanwhile
    TANDEM_TEST_EXIT_ONCE=PATH           with an EXIT hook: exit only if PATH does not exist yet
                                         (it is created first), so that a retry succeeds
    TANDEM_TEST_EXIT_STAMP=PATH          with an EXIT hook: write the time of death to PATH first
    TANDEM_TEST_NAN_AT_STEP=RANK:STEP    make global rank RANK's loss NaN in optimizer step STEP (a divergence)
    TANDEM_TEST_OOM_AT_STEP=RANK:STEP    raise the out-of-memory error a GPU raises, on rank RANK in step STEP
    TANDEM_TEST_RAISE_AT_STEP=RANK:STEP  raise a plain ValueError (what a bug raises) on rank RANK in step STEP
    TANDEM_TEST_LATE_EXPORT=RANK:SECONDS sleep SECONDS on global rank RANK before it joins the final export (a rank
                                         that gets there after rank 0 has published final/)
    TANDEM_TEST_ENV_DIGEST=NAME          every rank writes the sha256 of its environment variable NAME (not the value;
                                         "missing" when unset) to {run}/nodes/{node}/env-digest-rank-{rank}.txt, so
                                         that a test proves a forwarded credential reached the ranks without storing it
    TANDEM_TEST_DISJOINT_ROUTING=1       a mixture of experts' routers send every token of rank r to experts r*k ..
                                         r*k+k-1 (k per token): ranks that use disjoint experts in the same step, the
                                         case that hangs a layout gathering only the experts a rank routes to
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from storage.location import Location

log = logging.getLogger(__name__)
PREFIX = "TANDEM_TEST_"


class SavePoint(Enum):
    """A moment of a checkpoint's save where a writer may be made to die (TANDEM_TEST_EXIT_IN_SAVE's POINT)."""

    MID_UPLOAD = "mid_upload"
    AFTER_SHARD = "after_shard"
    BEFORE_COMPLETE = "before_complete"


@dataclass(frozen=True)
class At:
    """A hook's place: a global rank and an optimizer step (1-based), or a number of seconds for the timed hooks."""

    rank: int
    amount: float

    @classmethod
    def parse(cls, value: str | None) -> At | None:
        """RANK:AMOUNT, or None when unset."""
        if not value:
            return None
        rank, _, amount = value.partition(":")
        return cls(int(rank), float(amount))

    def step_is(self, rank: int, step: int) -> bool:
        """Whether this step hook is for `rank` at `step`."""
        return self.rank == rank and int(self.amount) == step


@dataclass(frozen=True)
class SaveExit:
    """TANDEM_TEST_EXIT_IN_SAVE: the rank, the step whose save it dies in, and where."""

    rank: int
    step: int
    point: SavePoint

    @classmethod
    def parse(cls, value: str | None) -> SaveExit | None:
        """RANK:STEP:POINT, or None when unset; a POINT that is not one is named."""
        if not value:
            return None
        rank, step, point = value.split(":")
        points = {p.value: p for p in SavePoint}
        if point not in points:
            raise ValueError(f"{PREFIX}EXIT_IN_SAVE={value}: POINT must be one of {', '.join(points)}")
        return cls(int(rank), int(step), points[point])


@dataclass(frozen=True)
class Faults:
    """The faults injected into this rank (see the module's docstring); every field empty in production."""

    slow: At | None = None
    late_export: At | None = None
    exit_at: At | None = None
    signal_at: At | None = None
    signal: str = "KILL"
    stall_at: At | None = None
    nan_at: At | None = None
    oom_at: At | None = None
    raise_at: At | None = None
    exit_in_save: SaveExit | None = None
    slow_save: float | None = None
    hold_save: str | None = None
    exit_once: str | None = None
    exit_stamp: str | None = None
    env_digest: str | None = None
    disjoint_routing: bool = False

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> Faults:
        """The faults the TANDEM_TEST_* variables of `env` ask for (NO_FAULTS when none is set)."""
        if not any(name.startswith(PREFIX) for name in env):
            return NO_FAULTS

        def get(name: str) -> str | None:
            return env.get(PREFIX + name) or None

        slow_save = get("SLOW_SAVE")
        return cls(
            slow=At.parse(get("SLOW_RANK")),
            late_export=At.parse(get("LATE_EXPORT")),
            exit_at=At.parse(get("EXIT_AT_STEP")),
            signal_at=At.parse(get("SIGNAL_AT_STEP")),
            signal=get("SIGNAL") or "KILL",
            stall_at=At.parse(get("STALL_AT_STEP")),
            nan_at=At.parse(get("NAN_AT_STEP")),
            oom_at=At.parse(get("OOM_AT_STEP")),
            raise_at=At.parse(get("RAISE_AT_STEP")),
            exit_in_save=SaveExit.parse(get("EXIT_IN_SAVE")),
            slow_save=float(slow_save) if slow_save else None,
            hold_save=get("HOLD_SAVE"),
            exit_once=get("EXIT_ONCE"),
            exit_stamp=get("EXIT_STAMP"),
            env_digest=get("ENV_DIGEST"),
            disjoint_routing=get("DISJOINT_ROUTING") == "1",
        )

    def slow_down(self, rank: int) -> None:
        """Sleep if this rank is the configured slow one (every micro-batch)."""
        if self.slow is not None and self.slow.rank == rank:
            time.sleep(self.slow.amount)

    def before_export(self, rank: int) -> None:
        """Sleep before the final export if this rank is the configured late one."""
        if self.late_export is not None and self.late_export.rank == rank:
            time.sleep(self.late_export.amount)

    def fires_at(self, rank: int, step: int) -> bool:
        """Whether a step hook fires on this rank in this step. The trainer lets the save in flight finish first, so
        that which checkpoint survives a step fault does not depend on how fast a background write was; a fault in the
        middle of a background save is the EXIT_IN_SAVE hook's."""
        hooks = (self.exit_at, self.signal_at, self.stall_at, self.raise_at, self.nan_at, self.oom_at)
        return any(hook is not None and hook.step_is(rank, step) for hook in hooks)

    def at_step(self, rank: int, step: int) -> None:
        """Exit abruptly (no cleanup, like a killed process), or die by a signal, if this rank should at this step."""
        if self.exit_at is not None and self.exit_at.step_is(rank, step):
            self._die()
        if self.signal_at is not None and self.signal_at.step_is(rank, step):
            signal.signal(signal.SIGABRT, signal.SIG_DFL)  # Python's faulthandler would otherwise catch the fatal ones
            signal.signal(signal.SIGSEGV, signal.SIG_DFL)
            signal.signal(signal.SIGBUS, signal.SIG_DFL)
            os.kill(os.getpid(), signal.Signals["SIG" + self.signal])

    def in_micro_batch(self, rank: int, step: int) -> None:
        """Before a micro-batch's forward pass: slow down, or hang (as a stuck kernel or a dead NFS mount would)."""
        self.slow_down(rank)
        if self.stall_at is not None and self.stall_at.step_is(rank, step):
            time.sleep(3600)

    def poison(self, loss: torch.Tensor, rank: int, step: int) -> torch.Tensor:
        """The micro-batch loss, made NaN or replaced by an out-of-memory error or a plain exception (a bug in a rank)
        if this rank and step are configured."""
        if self.raise_at is not None and self.raise_at.step_is(rank, step):
            raise ValueError(f"injected by {PREFIX}RAISE_AT_STEP at step {step}")
        if self.oom_at is not None and self.oom_at.step_is(rank, step):
            import torch

            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 2.00 GiB (injected by {PREFIX}OOM_AT_STEP)"
            )
        if self.nan_at is not None and self.nan_at.step_is(rank, step):
            return loss * float("nan")
        return loss

    def in_save(self, rank: int, step: int, point: SavePoint) -> None:
        """Called by the checkpoint writer at each SavePoint: slow down, or die if configured to."""
        if point is SavePoint.AFTER_SHARD:
            if self.slow_save:
                time.sleep(self.slow_save)
            if self.hold_save:
                deadline = time.monotonic() + 600
                while not os.path.exists(self.hold_save) and time.monotonic() < deadline:
                    time.sleep(0.1)
        if self.exit_in_save is not None and (rank, step, point) == (
            self.exit_in_save.rank,
            self.exit_in_save.step,
            self.exit_in_save.point,
        ):
            self._die()

    def record_env_digest(self, run_url: Location, node_rank: int, rank: int) -> None:
        """Write the digest of the environment variable env_digest names, if set, to the node's directory."""
        if not self.env_digest:
            return
        from storage import layout
        from storage.digest import digest_bytes
        from storage.fs import write_bytes_atomic
        from storage.location import join

        value = os.environ.get(self.env_digest)
        digest = digest_bytes(value.encode(), "sha256") if value else "missing"
        url = join(layout.node_dir(run_url, node_rank), f"env-digest-rank-{rank:05d}.txt")
        write_bytes_atomic(url, digest.encode())

    def route_disjointly(self, model: torch.nn.Module, rank: int) -> None:
        """With disjoint_routing, make every router of `model` (a module returning (logits, scores, expert indices),
        transformers' `*TopKRouter`) choose rank `rank`'s own experts for every token."""
        if not self.disjoint_routing:
            return
        import torch

        def force(module: torch.nn.Module, args: object, output: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            logits, scores, indices = output
            k, experts = indices.shape[-1], logits.shape[-1]
            own = (torch.arange(k, device=indices.device) + rank * k) % experts
            return logits, scores, own.expand_as(indices).contiguous()

        routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
        for module in routers:
            module.register_forward_hook(force)
        log.warning("%sDISJOINT_ROUTING: %d routers of rank %d forced to its own experts", PREFIX, len(routers), rank)

    def _die(self) -> None:
        """Exit at once, like a SIGKILLed process (no cleanup, no flush), honouring exit_once and exit_stamp."""
        if self.exit_once:
            try:
                os.close(os.open(self.exit_once, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return
        if self.exit_stamp:
            with open(self.exit_stamp, "w") as handle:
                handle.write(f"{time.time():.3f}\n")
        os._exit(137)


NO_FAULTS = Faults()
