"""`launch.backend: slurm`: one sbatch job, one task per node; `srun` starts `python -m flows.node` on
every node with Qwen's variables (MASTER_ADDR = the allocation's first host, NODE_RANK = SLURM_NODEID).

The job is submitted with `sbatch --parsable`, followed with `squeue` (running) and `sacct`, falling
back to `scontrol show job` where accounting is off, and cancelled with `scancel` whatever way this
function exits. `srun --kill-on-bad-exit=1` ends every node when one fails.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable

from config.errors import EXIT_USER_ERROR, RetryableError, UserError
from config.loader import PROJECT_ROOT
from storage.spec import Spec
from storage.fs import is_local, join, local_path, makedirs
from launch.agent import heartbeat_dir
from launch.watch import Watch, metrics_url

POLL_S = 2.0
DEFAULT_MASTER_PORT = 6001
FINAL_OK = {"COMPLETED"}
FINAL_BAD = {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def render_sbatch(spec: Spec, spec_url: str, phase: str, *, output: str, model_url: str | None = None,
                  spec_digest: str | None = None) -> str:
    """The batch script for one phase of a run."""
    launch = spec.config.launch
    node_args = ["--spec", spec_url, "--phase", phase]
    if model_url:
        node_args += ["--model", model_url]
    if spec_digest:
        node_args += ["--spec-digest", spec_digest]
    node_command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "flows.node", *node_args])
    env = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(launch.env.items()))
    extra = "".join(f"#SBATCH {arg}\n" for arg in launch.slurm_args)
    return f"""#!/bin/bash
#SBATCH --job-name=tandem-{spec.run_id}-{phase}
#SBATCH --nodes={launch.nnodes}
#SBATCH --ntasks-per-node=1
#SBATCH --output={output}
{extra}set -euo pipefail
# Qwen's multi-node variables, from the allocation: node 0 is the first host.
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT={launch.master_port or DEFAULT_MASTER_PORT}
export NNODES=$SLURM_JOB_NUM_NODES
export GPUS_PER_NODE={launch.nproc_per_node}
export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-1}}
{env}cd {shlex.quote(str(PROJECT_ROOT))}
srun --nodes={launch.nnodes} --ntasks-per-node=1 --kill-on-bad-exit=1 \\
    bash -c 'export NODE_RANK=$SLURM_NODEID; exec {node_command}'
"""


def run(command: list[str]) -> str:
    """Run a SLURM command; a missing command or a refusal is a one-line error."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise UserError(f"launch.backend=slurm: {command[0]} not found; run the pipeline on a SLURM login node") from None
    if done.returncode != 0:
        raise RetryableError(f"{' '.join(command[:2])} failed: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def submit(script_path: str) -> str:
    """sbatch --parsable: the job id."""
    return run(["sbatch", "--parsable", script_path]).strip().split(";")[0]


def job_state(job_id: str) -> tuple[str, str]:
    """(state, exit code) of a job: squeue while it is queued or running, then sacct or scontrol."""
    queued = run(["squeue", "-h", "-j", job_id, "-o", "%T"]).strip() if _squeue_knows(job_id) else ""
    if queued:
        return queued.split()[0], ""
    try:
        rows = run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,ExitCode"]).strip().splitlines()
        if rows:
            state, code = rows[0].split("|")
            return state.split()[0], code
    except RetryableError:  # accounting disabled: scontrol remembers finished jobs for MinJobAge
        pass
    shown = run(["scontrol", "show", "job", job_id])
    state = re.search(r"JobState=(\S+)", shown)
    code = re.search(r"ExitCode=(\S+)", shown)
    return (state.group(1) if state else "UNKNOWN"), (code.group(1) if code else "")


def _squeue_knows(job_id: str) -> bool:
    done = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=60)
    return done.returncode == 0 and bool(done.stdout.strip())


def run_slurm_nodes(spec: Spec, spec_url: str, phase: str, info: Callable[[str], None], *,
                    model_url: str | None = None, spec_digest: str | None = None,
                    on_progress: Callable[[dict], None] | None = None) -> None:
    """Submit the phase as one job over launch.nnodes nodes and wait; raise naming the failure."""
    if not is_local(spec.run_url):
        raise UserError("launch.backend=slurm needs run.storage on a shared filesystem (NFS) for the job script")
    launch = spec.config.launch
    jobs_dir = join(spec.run_url, "slurm")
    makedirs(jobs_dir)
    script = local_path(join(jobs_dir, f"{phase}.sbatch"))
    output = local_path(join(jobs_dir, f"{phase}-%j.out"))
    with open(script, "w") as handle:
        handle.write(render_sbatch(spec, spec_url, phase, output=output, model_url=model_url, spec_digest=spec_digest))
    job_id = submit(script)
    info(f"{phase}: SLURM job {job_id} submitted ({launch.nnodes} nodes, script {script})")
    watch = None
    finished = False
    try:
        while True:
            state, code = job_state(job_id)
            if state in FINAL_OK:
                finished = True
                return
            if state in FINAL_BAD:
                finished = True
                out = output.replace("%j", job_id)
                text = _read(out)
                errors = [line[len("error: "):] for line in text.splitlines() if line.startswith("error: ")]
                tail = "".join(text.splitlines(keepends=True)[-10:])
                message = (f"{phase}: SLURM job {job_id} ended {state} (exit {code}): "
                           f"{errors[0] if errors else 'no error line from the nodes'}\nlast lines of {out}:\n{tail}")
                user_error = code.split(":")[0] == str(EXIT_USER_ERROR)
                raise (UserError if user_error else RetryableError)(message)
            if state == "RUNNING" and on_progress is not None:
                if watch is None:  # time in the queue is not a stall: start the clock when it runs
                    beats = {n: heartbeat_dir(spec.run_url, n, phase) for n in range(launch.nnodes)}
                    watch = Watch(metrics_url(spec.run_url), beats, launch.stall_timeout, launch.rdzv_timeout,
                                  on_progress)
                watch.poll()
            time.sleep(POLL_S)
    finally:
        if not finished:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=60)


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as handle:
            return handle.read()
    except OSError:
        return "(no output file)\n"
