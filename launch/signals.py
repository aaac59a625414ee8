"""A rank or a torchrun agent that died by a signal, said in words: the signal by name and number, the step the run had
reached, and the likely cause with the check that confirms it. A killed rank writes nothing (SIGKILL cannot be caught),
so its node's log has no line of its own to show; torchrun's report has only its exit code, the negative signal number.
A killed agent writes no report at all: its own exit code is the negative signal number (torchrun turns SIGTERM, SIGINT
and SIGHUP into an exception whose last line says `got signal: N`, and exits 1).
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass

from config.memory_plan import GB
from launch.fit import run_plan
from storage.metrics import read_metrics
from storage.spec import Spec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Death:
    """What the node knew when a rank died: the last step the run recorded, and its memory plan's host peak of one
    rank (None: unknown)."""

    step: int | None = None
    rank_bytes: int | None = None


def death_of(spec: Spec, *, on_gpu: bool) -> Death:
    """The last step {run}/metrics.jsonl recorded and the plan's host peak per rank, each None where unknown: a
    diagnosis must never fail for want of them."""
    try:
        steps = [record["step"] for record in read_metrics(spec.run) if isinstance(record.get("step"), int)]
    except (OSError, ValueError) as exc:
        log.warning("could not read the run's last step: %s", exc)
        steps = []
    try:
        memory = run_plan(spec, on_gpu=on_gpu)
    except (OSError, ValueError) as exc:
        log.warning("could not compute the memory plan: %s", exc)
        memory = None
    return Death(steps[-1] if steps else None, memory.host_bytes if memory else None)


def cause(number: int, death: Death) -> str:
    """The likely cause of a death by signal `number`, with the check that confirms it."""
    if number == signal.SIGKILL:
        planned = f"; the memory plan said {death.rank_bytes / GB:.1f} GB per rank" if death.rank_bytes else ""
        return (
            f"the kernel's out-of-memory killer sends this{planned}; check `dmesg` (or `journalctl -k`) on that node "
            "for 'Out of memory: Killed process', then lower train.micro_batch_size or data.max_length, or give the "
            "node more memory (a container's memory limit kills the same way)"
        )
    if number == signal.SIGSEGV:
        return (
            "a crash in native code (a CUDA, NCCL or compiled kernel library, or torch and DeepSpeed builds that do "
            "not match); check `dmesg` for the library that faulted and `pip list` for the versions"
        )
    if number == signal.SIGBUS:
        return (
            "shared memory ran out (a container's /dev/shm is 64 MB by default) or a memory-mapped file shrank under "
            "the rank; check `df -h /dev/shm` and give the container more (--shm-size, or an emptyDir of medium Memory)"
        )
    if number == signal.SIGABRT:
        return (
            "a library aborted the process (a C++ assertion, NCCL's watchdog, a CUDA error); the lines just before "
            "it in the node's log say which"
        )
    return "a signal from outside the run (a person, a scheduler, a supervisor); check what manages that node"


def agent_cause(number: int, pid: int, death: Death) -> str:
    """The likely cause of a torchrun agent's death by signal `number`, with the check that confirms it: the agent
    itself holds little memory, so a signal from outside the run is the first suspect."""
    if number == signal.SIGKILL:
        planned = f" (the memory plan said {death.rank_bytes / GB:.1f} GB per rank)" if death.rank_bytes else ""
        return (
            "a kill -9 from outside the run (a person, a scheduler or container runtime stopping the node) or the "
            f"kernel's out-of-memory killer{planned}; check `dmesg` (or `journalctl -k`) on that node for 'Killed "
            f"process {pid}', and what manages that node (the scheduler's or the container runtime's log)"
        )
    if number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        return (
            "a stop from outside the run (a person, a scheduler's time limit or preemption, the node or its container "
            f"shutting down, a closed terminal); check what manages that node (the scheduler's log, `journalctl`) for "
            f"who stopped process {pid}"
        )
    return cause(number, death)


def signal_name(number: int) -> str:
    """SIGKILL for 9; `an unknown signal` for a number that names none."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return "an unknown signal"


def agent_killed_by(number: int, pid: int, death: Death) -> str:
    """`its torchrun agent (pid 4242) was killed by SIGKILL (signal 9) after step 7; likely cause: ...` for an agent
    that died by signal `number`."""
    at = f" after step {death.step}" if death.step is not None else ""
    return (
        f"its torchrun agent (pid {pid}) was killed by {signal_name(number)} (signal {number}){at}; likely cause: "
        f"{agent_cause(number, pid, death)}"
    )


def killed_by(code: int, death: Death) -> str | None:
    """`was killed by SIGKILL (signal 9) after step 7; likely cause: ...` for a negative exit code (torchrun's for a
    rank that died by a signal), None for an exit of its own."""
    if code >= 0:
        return None
    number = -code
    at = f" after step {death.step}" if death.step is not None else ""
    return f"was killed by {signal_name(number)} (signal {number}){at}; likely cause: {cause(number, death)}"
