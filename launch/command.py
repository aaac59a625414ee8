"""What runs on a node: the torchrun line and the ranks' environment (every backend uses these), and where a node
keeps its local files. The module and arguments the ranks run are the job's (launch/job.py)."""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import sys
from collections.abc import Mapping

from config.sections.launch import LaunchConfig
from core.checkout import PROJECT_ROOT
from launch.forward import forward_env
from launch.job import NodePlan, Phase
from launch.network import interface_environment, source_address
from storage import layout
from storage.location import Location, is_local, local_path

DEFAULT_MASTER_PORT = 6001  # Qwen's scripts' default; preflight refuses it if it is taken
AGENT_TAG_ENV = "TANDEM_AGENT_TAG"


def free_port() -> int:
    """A TCP port nobody listens on right now (a fresh one per launch: a reused port can join an old job)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_command(plan: NodePlan, rdzv_timeout: int, module: str, args: list[str]) -> list[str]:
    """The per-node torchrun line (the same for every backend)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={plan.nnodes}",
        f"--nproc-per-node={plan.nproc_per_node}",
        f"--node-rank={plan.node_rank}",
        f"--master-addr={plan.master_addr}",
        f"--master-port={plan.master_port}",
        "--rdzv-conf",
        f"timeout={rdzv_timeout}",
        "-m",
        module,
        *args,
    ]


# What the transport logs on a retry after a failure (NCCL's and gloo's own view of the connections), and the names
# always passed from the launcher's environment to the nodes.
TRANSPORT_DEBUG = {
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,NET",
    "TORCH_CPP_LOG_LEVEL": "INFO",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
}
FORWARDED = tuple(TRANSPORT_DEBUG)


def node_environment(launch: LaunchConfig, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a launcher hands to every node process beyond the node's own environment: the FORWARDED names
    this process has, the job's own (`extra`: PhaseJob.env), launch.forward_env's credentials (launch/forward.py) and
    launch.env. The one place that decides it: the local agents get it on top of this process's environment, the ssh
    backend sends it over each connection's stdin (never on a command line). The storage options of the run are no
    part of it: they travel in `--spec` (launch/job.py)."""
    forwarded = {name: os.environ[name] for name in FORWARDED if name in os.environ}
    return {**forwarded, **(extra or {}), **forward_env(launch), **launch.env}


def transport_debug_env() -> dict[str, str]:
    """What a retry after a failure adds to the job's environment (PhaseJob.env): the ranks log what NCCL and gloo
    see, at the levels of TRANSPORT_DEBUG, unless this process names a level itself (then that one is forwarded)."""
    return {name: value for name, value in TRANSPORT_DEBUG.items() if name not in os.environ}


MALLOC_MMAP_THRESHOLD = 2**20  # bytes; see rank_environment


def rank_environment(
    launch: LaunchConfig, master_addr: str | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Environment for every rank: this node's own, one thread per rank on CPU, glibc's heap giving large blocks back,
    a per-checkout extension cache, the node environment (launch.forward_env's credentials and the job's `extra`
    among them), and, with `master_addr`, the interface that routes to it (launch/network.py) unless the user named
    one. A variable the node already sets (OMP_NUM_THREADS, MALLOC_MMAP_THRESHOLD_) is kept. A value: this process's
    environment is read, never changed (the local backend's nodes are threads of one process)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # without it tiny CPU steps run ~10x slower
    # glibc raises its mmap threshold up to 32 MiB as large blocks are freed, after which a layer's tensors come from
    # the heap and, freed, stay with the process: a 0.5B model under ZeRO-3 held 9.4 GB per rank instead of 6.7
    # (docs/large-models.md). A fixed threshold keeps every block of 1 MiB or more a mapping given back when freed.
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(MALLOC_MMAP_THRESHOLD))
    env.setdefault("TORCH_EXTENSIONS_DIR", str(PROJECT_ROOT / ".tandem" / "torch_extensions"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH", "")]))
    env["PYTHONUNBUFFERED"] = "1"
    env[layout.RANK_PROCESS_ENV] = "1"  # the ranks keep MLflow out of their start (trainer/model/lean_imports.py)
    env.update(node_environment(launch, extra))
    if master_addr is not None:
        env.update(interface_environment(master_addr, env))
        with contextlib.suppress(OSError):
            env[layout.NODE_ADDR_ENV] = source_address(master_addr)
    return env


def environment_lines(env: Mapping[str, str], launch: LaunchConfig) -> list[str]:
    """`NAME=value` lines of an environment for a description (a dry run), sorted, with the values of
    launch.forward_env's names masked: a credential is never printed."""
    hidden = set(launch.forward_env)
    return [f"{name}={'***' if name in hidden else shlex.quote(value)}" for name, value in sorted(env.items())]


def node_scratch(run_url: Location, node_rank: int) -> str:
    """A local directory for a node's log: the run's node directory when storage is local, else a
    local mirror that is uploaded after each phase (object stores cannot append)."""
    if is_local(run_url):
        return local_path(layout.node_dir(run_url, node_rank))
    run_id = str(run_url).rstrip("/").rsplit("/", 1)[1]
    return str(PROJECT_ROOT / ".tandem" / "scratch" / run_id / "nodes" / str(node_rank))


def heartbeat_dir(run_url: Location, node_rank: int, phase: Phase) -> str:
    """Where the ranks of a node touch their heartbeat files during a phase."""
    return os.path.join(node_scratch(run_url, node_rank), f"heartbeat-{phase.name}")
