"""Preflight: run on every node before its torchrun agent starts; the first failing check stops the job
with one line naming the node, the check and the fix (the troubleshooting list of Qwen's multi-node
guide, checked instead of debugged).

Checks: world size (rank mismatch), code version, spec.json digest, master address resolvable, master
port free on node 0 / reachable from the others, GPU count and model, the free space on run.storage and this node's
disk against what the run will write (launch/space.py), the dataset the ranks read verified against its
manifest (in place, or the node cache's copy, fetched once per node), this node's copy of the base model against the
run's base_model.json, storage writable, eval.tasks' names known to this node's lm-evaluation-harness, the NCCL/GLOO
environment applied (echoed), each launch.forward_env name set on this node (reported "set"/"missing", never its
value), the interface the ranks use (chosen by route to the master, or the user's checked), this host's name resolving
to a loopback address, and the InfiniBand/RoCE fabric.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from config.lm_tasks import harness_version, task_manager
from config.vision import PROCESSOR_FILES
from core.checkout import code_version
from core.errors import RetryableError, UserError
from core.redact import mask_text
from launch.fit import check_fit
from launch.forward import check_forwarded
from launch.job import NodePlan
from launch.network import check_interfaces, fabric, hostname_note
from launch.space import check_space
from storage import layout
from storage.base_model import read_base_model, verify_local_model
from storage.digest import digest_bytes
from storage.fs import read_bytes, remove, write_bytes_atomic, write_json_atomic
from storage.local_dataset import prepare_dataset
from storage.location import Location, join
from storage.node_cache import cache_root, node_cache
from storage.spec import Spec

CONNECT_RETRY_S = 0.5


def check_world_size(spec: Spec, plan: NodePlan) -> str:
    """NNODES x GPUS_PER_NODE must be the world size spec.json was resolved for."""
    if plan.nnodes * plan.nproc_per_node != spec.world_size or not 0 <= plan.node_rank < plan.nnodes:
        raise UserError(
            f"node {plan.node_rank}: rank mismatch: {plan.nnodes} nodes x {plan.nproc_per_node} ranks (node rank "
            f"{plan.node_rank}) but spec.json was resolved for {spec.world_size} ranks "
            f"({spec.config.launch.nnodes} x {spec.config.launch.nproc_per_node}); give every node the same "
            "NNODES/GPUS_PER_NODE and a unique NODE_RANK in 0..NNODES-1"
        )
    return f"{plan.nnodes} nodes x {plan.nproc_per_node} ranks"


def check_code(spec: Spec, plan: NodePlan) -> str:
    """The code on this node is the code that wrote spec.json."""
    mine = code_version()
    if mine != spec.code_version:
        raise UserError(
            f"node {plan.node_rank}: code version {mine} differs from {spec.code_version} in spec.json; "
            "install the same Tandem commit on every node"
        )
    return mine


def check_spec_digest(spec_url: Location, expected: str | None, plan: NodePlan) -> str:
    """This node reads the same spec.json bytes as the pipeline wrote."""
    actual = digest_bytes(read_bytes(spec_url), "sha256")
    if expected and actual != expected:
        raise UserError(
            f"node {plan.node_rank}: {spec_url} has sha256 {actual[:12]}…, the pipeline wrote "
            f"{expected[:12]}…; this node sees another spec.json (another run.storage, or a stale NFS "
            "cache): point every node at the same storage"
        )
    return actual


def check_master_resolves(plan: NodePlan) -> str:
    """MASTER_ADDR resolves to an address."""
    try:
        infos = socket.getaddrinfo(plan.master_addr, plan.master_port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UserError(
            f"node {plan.node_rank}: cannot resolve master address {plan.master_addr} ({exc.strerror}); "
            "set launch.master_addr (MASTER_ADDR) to node 0's IP or hostname"
        ) from None
    return str(infos[0][4][0])


def check_port_free(plan: NodePlan) -> str:
    """On node 0: the rendezvous port can be bound on MASTER_ADDR (nothing else holds it)."""
    with socket.socket() as sock:
        # As the rendezvous store binds it: connections of a finished attempt in TIME_WAIT do not hold the port, a
        # listener does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((plan.master_addr, plan.master_port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UserError(
                    f"node 0: port {plan.master_port} on {plan.master_addr} is already in use; pick "
                    "another launch.master_port (MASTER_PORT), leave it empty for a free one, or stop "
                    "what holds it"
                ) from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise UserError(
                    f"node 0: {plan.master_addr} is not an address of this machine; node rank 0 must "
                    "run on the host launch.master_addr (MASTER_ADDR) names"
                ) from None
            raise
    return f"{plan.master_addr}:{plan.master_port} free"


def check_master_reachable(plan: NodePlan, timeout_s: float, poll: Callable[[], None] | None = None) -> str:
    """On the other nodes: node 0's rendezvous port accepts connections (waiting up to timeout_s, calling `poll`
    meanwhile: it raises when the job stopped elsewhere)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if poll is not None:
            poll()
        try:
            with socket.create_connection((plan.master_addr, plan.master_port), timeout=2.0):
                return f"{plan.master_addr}:{plan.master_port} reachable"
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            if time.monotonic() >= deadline:
                raise RetryableError(
                    f"node {plan.node_rank}: cannot reach {plan.master_addr}:{plan.master_port} ({reason.lower()}) "
                    "— is node 0 up and the port open?"
                ) from None
            time.sleep(CONNECT_RETRY_S)


@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi reports it."""

    name: str
    free_mib: int
    total_mib: int


def gpus() -> list[Gpu] | None:
    """Every GPU this machine shows, with its free and total memory; None without nvidia-smi (a machine without
    GPUs)."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.free,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if out.returncode != 0:  # e.g. "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"
        said = (out.stdout + out.stderr).strip().splitlines()
        raise UserError(
            f"nvidia-smi failed on {socket.gethostname()} (exit {out.returncode}: {said[0] if said else 'no output'}); "
            "fix the GPU driver on this node, or run it without GPUs"
        )
    found = []
    for line in out.stdout.splitlines():
        if line.strip():
            name, free, total = (field.strip() for field in line.rsplit(",", 2))
            found.append(Gpu(name, int(free), int(total)))
    return found


def gpu_names() -> list[str] | None:
    """The model name of every GPU this machine shows; None without nvidia-smi."""
    found = gpus()
    return None if found is None else [g.name for g in found]


def visible_gpus() -> int:
    """GPUs this machine shows (0 without nvidia-smi)."""
    return len(gpus() or [])


def least_free_gpu_bytes() -> int | None:
    """The free memory of this machine's least free GPU, None without GPUs."""
    found = gpus()
    return min(g.free_mib for g in found) * 2**20 if found else None


def check_gpus(plan: NodePlan) -> str:
    """On GPU machines: at least nproc_per_node GPUs, all of one model (reported for cross-node comparison), and the
    free memory of the least free one (another job's memory shows there before training runs out of it)."""
    found = gpus()
    if found is None:
        return "no GPU (CPU ranks, gloo)"
    if len(found) < plan.nproc_per_node:
        raise UserError(
            f"node {plan.node_rank}: {len(found)} GPUs visible, {plan.nproc_per_node} ranks requested; "
            "set launch.nproc_per_node (GPUS_PER_NODE) to the GPUs every node has"
        )
    names = sorted({g.name for g in found})
    if len(names) > 1:
        raise UserError(f"node {plan.node_rank}: mixed GPU models {names}; use one model per job")
    if not found:
        return "no GPU"
    least = min(found, key=lambda g: g.free_mib)
    return (
        f"{len(found)} x {names[0]}, the least free {least.free_mib / 1024:.1f} of {least.total_mib / 1024:.1f} GiB "
        "free"
    )


def check_dataset(spec: Spec, plan: NodePlan) -> str:
    """The manifest is the one spec.json names, and what this node's ranks will read matches it: the files in place,
    or the node cache's copy (fetched, or fetched again where it differs)."""
    try:
        return prepare_dataset(spec.dataset_dir, spec.dataset.manifest_digest, node_cache(spec.config.launch))
    except UserError as exc:
        raise UserError(f"node {plan.node_rank}: {exc}") from None


def check_base_model(spec: Spec, plan: NodePlan) -> str:
    """This node's copy of the base model has every file of {run}/base_model.json, of the same size and digest (a
    vision-language model's processor files among them: its image processor decides every image's tokens)."""
    if spec.model_manifest_digest is None:
        return "not recorded (a spec.json written without it)"
    cache = cache_root(spec.config.launch.node_cache_dir)
    try:
        manifest = read_base_model(spec.run, spec.model_manifest_digest)
        files, cached = verify_local_model(manifest, spec.model_path, cache)
    except UserError as exc:
        raise UserError(f"node {plan.node_rank}: base model: {exc}") from None
    processor = [f["path"] for f in manifest["files"] if f["path"] in PROCESSOR_FILES]
    among = f" (the processor's {', '.join(sorted(processor))} among them)" if processor else ""
    return f"{files} files ({manifest['bytes'] / 1e9:.2f} GB) match{among}, {cached} digests from the node cache"


def check_storage_writable(spec: Spec, plan: NodePlan) -> str:
    """This node can write (and read back) the run directory."""
    probe = join(layout.node_dir(spec.run, plan.node_rank), ".preflight-probe")
    try:
        write_bytes_atomic(probe, b"ok")
        readback = read_bytes(probe)
        remove(probe)
    except OSError as exc:
        raise UserError(
            f"node {plan.node_rank}: cannot write {spec.run} ({exc}); give this node write access to run.storage"
        ) from None
    if readback != b"ok":
        raise UserError(f"node {plan.node_rank}: {probe} read back differently than written; check run.storage")
    return "writable"


def check_tasks(spec: Spec, plan: NodePlan) -> str:
    """eval.tasks' names against this node's lm-evaluation-harness (and eval.tasks.include_path), before training
    rather than after it; their data is loaded by the evaluation (config/lm_tasks.py)."""
    cfg = spec.config.eval.tasks
    if not cfg.names:
        return "none (eval.tasks)"
    try:
        task_manager(cfg)
    except UserError as exc:
        raise UserError(f"node {plan.node_rank}: {exc}") from None
    return f"{', '.join(cfg.names)} known to lm-evaluation-harness {harness_version()}"


def check_env(spec: Spec, plan: NodePlan) -> str:
    """The launch.env entries every rank will get (NCCL_SOCKET_IFNAME, ...), echoed (secret-looking values masked,
    though the config refuses them)."""
    env = spec.config.launch.env
    return mask_text(", ".join(f"{k}={v}" for k, v in sorted(env.items()))) or "(launch.env empty)"


def preflight_checks(
    spec: Spec,
    spec_url: Location,
    plan: NodePlan,
    expected_spec_digest: str | None,
    poll: Callable[[], None] | None,
) -> list[tuple[str, Callable[[], str]]]:
    """Every check of one node, named, in the order they run."""
    user_env = {**os.environ, **spec.config.launch.env}
    return [
        ("world size", lambda: check_world_size(spec, plan)),
        ("code version", lambda: check_code(spec, plan)),
        ("spec digest", lambda: check_spec_digest(spec_url, expected_spec_digest, plan)),
        # Before the wait for node 0: a bad copy of the model on this node is this node's own problem.
        ("base model", lambda: check_base_model(spec, plan)),
        ("master address", lambda: check_master_resolves(plan)),
        (
            "master port",
            lambda: (
                check_port_free(plan)
                if plan.node_rank == 0
                else check_master_reachable(plan, spec.config.launch.rdzv_timeout, poll)
            ),
        ),
        ("gpus", lambda: check_gpus(plan)),
        # Before the dataset's copy is fetched into the node cache: the copy is among what it counts.
        ("space", lambda: check_space(spec, plan, bf16=visible_gpus() > 0)),
        ("memory", lambda: check_fit(spec, plan, gpu_free_bytes=least_free_gpu_bytes())),
        ("dataset", lambda: check_dataset(spec, plan)),
        ("storage", lambda: check_storage_writable(spec, plan)),
        ("benchmark tasks", lambda: check_tasks(spec, plan)),
        ("environment", lambda: check_env(spec, plan)),
        ("forwarded environment", lambda: check_forwarded(spec.config.launch, plan.node_rank, socket.gethostname())),
        ("interface", lambda: check_interfaces(plan.node_rank, plan.master_addr, user_env)),
        ("hostname", lambda: hostname_note(plan.nnodes, plan.master_addr)),
        ("fabric", lambda: fabric(user_env)),
    ]


def run_preflight(
    spec: Spec,
    spec_url: Location,
    plan: NodePlan,
    *,
    expected_spec_digest: str | None,
    info: Callable[[str], None],
    poll: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Every check for one node, in order; writes nodes/{r}/preflight.json and returns the report. `poll` is called
    while waiting for node 0 (a node process's claim: it raises when another node failed)."""
    report: dict[str, Any] = {"node_rank": plan.node_rank, "host": socket.gethostname(), "checks": {}}
    for name, check in preflight_checks(spec, spec_url, plan, expected_spec_digest, poll):
        report["checks"][name] = check()
    write_json_atomic(join(layout.node_dir(spec.run, plan.node_rank), layout.PREFLIGHT), report)
    shown = (
        "gpus",
        "space",
        "memory",
        "dataset",
        "base model",
        "environment",
        "forwarded environment",
        "master port",
        "interface",
        "fabric",
    )
    info(
        f"node {plan.node_rank} preflight ok on {report['host']}: "
        + "; ".join(f"{k}: {v}" for k, v in report["checks"].items() if k in shown)
    )
    if report["checks"]["hostname"].startswith("warning:"):
        info(f"node {plan.node_rank}: {report['checks']['hostname']}")
    return report


def check_present(slot: int) -> str:
    """The node in this slot is there. Test hook TANDEM_TEST_LOST_NODE=SLOT:PATH: slot SLOT is gone for good once
    PATH exists (paired with TANDEM_TEST_EXIT_ONCE=PATH, which creates PATH when the node's rank dies), so every
    retry finds it unreachable, as a spot machine that was taken back."""
    hook = os.environ.get("TANDEM_TEST_LOST_NODE", "")
    lost, _, marker = hook.partition(":")
    if hook and int(lost) == slot and os.path.exists(marker):
        raise RetryableError(f"node {slot}: unreachable (lost)")
    return "present"


def probe_node(spec: Spec, slot: int) -> str | None:
    """The node-local checks of preflight for the node in `slot` (present, code, GPUs, storage), before an elastic
    run picks its nodes: the first problem in one line, or None. The rendezvous checks follow in run_preflight."""
    plan = NodePlan(slot, slot + 1, spec.config.launch.nproc_per_node, spec.config.launch.rendezvous_addr, 0)
    try:
        check_present(slot)
        check_code(spec, plan)
        check_gpus(plan)
        check_storage_writable(spec, plan)
    except (UserError, RetryableError) as exc:
        return str(exc)
    return None


def plan_environment(plan: NodePlan) -> dict[str, str]:
    """Qwen-style variables describing the node, for logs and scripts the user runs under us."""
    return {
        "NNODES": str(plan.nnodes),
        "NODE_RANK": str(plan.node_rank),
        "MASTER_ADDR": plan.master_addr,
        "MASTER_PORT": str(plan.master_port),
        "GPUS_PER_NODE": str(plan.nproc_per_node),
    }
