"""Test-only fault hooks, off unless their environment variable is set. They let tests make a rank
slow or die at a chosen step through the real entry point, instead of mocking the trainer.

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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from storage.location import Location

log = logging.getLogger(__name__)
SAVE_POINTS = ("mid_upload", "after_shard", "before_complete")


def _parse(name: str) -> tuple[int, float] | None:
    value = os.environ.get(name)
    if not value:
        return None
    rank, _, amount = value.partition(":")
    return int(rank), float(amount)


def maybe_slow(rank: int) -> None:
    """Sleep if this rank is the configured slow one."""
    hook = _parse("TANDEM_TEST_SLOW_RANK")
    if hook and hook[0] == rank:
        time.sleep(hook[1])


def maybe_late_export(rank: int) -> None:
    """Sleep before the final export if this rank is the configured late one."""
    hook = _parse("TANDEM_TEST_LATE_EXPORT")
    if hook and hook[0] == rank:
        time.sleep(hook[1])


def _die() -> None:
    """Exit at once, like a SIGKILLed process (no cleanup, no flush), honouring EXIT_ONCE and EXIT_STAMP."""
    once = os.environ.get("TANDEM_TEST_EXIT_ONCE")
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
    stamp = os.environ.get("TANDEM_TEST_EXIT_STAMP")
    if stamp:
        with open(stamp, "w") as handle:
            handle.write(f"{time.time():.3f}\n")
    os._exit(137)


def maybe_record_env_digest(run_url: Location, node_rank: int, rank: int) -> None:
    """Write the digest of the environment variable TANDEM_TEST_ENV_DIGEST names, if set, to the node's directory."""
    name = os.environ.get("TANDEM_TEST_ENV_DIGEST")
    if not name:
        return
    from storage import layout
    from storage.digest import digest_bytes
    from storage.fs import write_bytes_atomic
    from storage.location import join

    value = os.environ.get(name)
    digest = digest_bytes(value.encode(), "sha256") if value else "missing"
    write_bytes_atomic(join(layout.node_dir(run_url, node_rank), f"env-digest-rank-{rank:05d}.txt"), digest.encode())


STEP_HOOKS = (
    "TANDEM_TEST_EXIT_AT_STEP",
    "TANDEM_TEST_SIGNAL_AT_STEP",
    "TANDEM_TEST_STALL_AT_STEP",
    "TANDEM_TEST_RAISE_AT_STEP",
    "TANDEM_TEST_NAN_AT_STEP",
    "TANDEM_TEST_OOM_AT_STEP",
)


def fires_at(rank: int, step: int) -> bool:
    """Whether a step hook fires on this rank in this step. The trainer lets the save in flight finish first, so
    that which checkpoint survives a step fault does not depend on how fast a background write was; a fault in the
    middle of a background save is the EXIT_IN_SAVE hook's."""
    return any((hook := _parse(name)) and hook[0] == rank and int(hook[1]) == step for name in STEP_HOOKS)


def maybe_exit(rank: int, step: int) -> None:
    """Exit abruptly (no cleanup, like a killed process) if this rank should die at this step."""
    hook = _parse("TANDEM_TEST_EXIT_AT_STEP")
    if hook and hook[0] == rank and int(hook[1]) == step:
        _die()
    hook = _parse("TANDEM_TEST_SIGNAL_AT_STEP")
    if hook and hook[0] == rank and int(hook[1]) == step:
        signal.signal(signal.SIGABRT, signal.SIG_DFL)  # Python's faulthandler would otherwise catch the fatal ones
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)
        signal.signal(signal.SIGBUS, signal.SIG_DFL)
        os.kill(os.getpid(), signal.Signals["SIG" + os.environ.get("TANDEM_TEST_SIGNAL", "KILL")])


def maybe_stall(rank: int, step: int) -> None:
    """Hang (as a stuck kernel or a dead NFS mount would) if this rank should stall at this step."""
    hook = _parse("TANDEM_TEST_STALL_AT_STEP")
    if hook and hook[0] == rank and int(hook[1]) == step:
        time.sleep(3600)


def maybe_poison(loss: torch.Tensor, rank: int, step: int) -> torch.Tensor:
    """The micro-batch loss, made NaN or replaced by an out-of-memory error or a plain exception (a bug in a rank) if
    this rank and step are configured."""
    nan, oom = _parse("TANDEM_TEST_NAN_AT_STEP"), _parse("TANDEM_TEST_OOM_AT_STEP")
    crash = _parse("TANDEM_TEST_RAISE_AT_STEP")
    if crash and crash[0] == rank and int(crash[1]) == step:
        raise ValueError(f"injected by TANDEM_TEST_RAISE_AT_STEP at step {step}")
    if oom and oom[0] == rank and int(oom[1]) == step:
        import torch

        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB (injected by TANDEM_TEST_OOM_AT_STEP)"
        )
    if nan and nan[0] == rank and int(nan[1]) == step:
        return loss * float("nan")
    return loss


def in_save(rank: int, step: int, point: str) -> None:
    """Called by the checkpoint writer at each SAVE_POINTS moment: slow down, or die if configured to."""
    assert point in SAVE_POINTS, point
    slow = os.environ.get("TANDEM_TEST_SLOW_SAVE")
    if slow and point == "after_shard":
        time.sleep(float(slow))
    hold = os.environ.get("TANDEM_TEST_HOLD_SAVE")
    if hold and point == "after_shard":
        deadline = time.monotonic() + 600
        while not os.path.exists(hold) and time.monotonic() < deadline:
            time.sleep(0.1)
    value = os.environ.get("TANDEM_TEST_EXIT_IN_SAVE")
    if not value:
        return
    want_rank, want_step, want_point = value.split(":")
    if want_point not in SAVE_POINTS:
        raise ValueError(f"TANDEM_TEST_EXIT_IN_SAVE={value}: POINT must be one of {', '.join(SAVE_POINTS)}")
    if (int(want_rank), int(want_step), want_point) == (rank, step, point):
        _die()


def maybe_force_disjoint_routing(model: torch.nn.Module, rank: int) -> None:
    """With TANDEM_TEST_DISJOINT_ROUTING, make every router of `model` (a module returning (logits, scores,
    expert indices), transformers' `*TopKRouter`) choose rank `rank`'s own experts for every token."""
    if os.environ.get("TANDEM_TEST_DISJOINT_ROUTING") != "1":
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
    log.warning("TANDEM_TEST_DISJOINT_ROUTING: %d routers of rank %d forced to its own experts", len(routers), rank)
