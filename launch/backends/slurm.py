"""`launch.backend: slurm`: one sbatch job, one task per node; `srun` starts `python -m launch.node` on
every node with Qwen's variables (MASTER_ADDR = the allocation's first host, NODE_RANK = SLURM_NODEID).

The job is submitted with `sbatch --parsable`, followed with `squeue` (running) and `sacct`, falling back to
`scontrol show job` where accounting is off, and cancelled with `scancel` whatever way the phase ends short of its
completion. `srun --kill-on-bad-exit=1` ends every node when one fails. The job is one member with nothing to settle
between nodes, and its stall watch starts only once it leaves the queue, so it keeps a follow loop of its own rather
than launch/supervise.py's.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass

from config.sections.launch import LaunchConfig
from core.checkout import PROJECT_ROOT
from core.errors import RetryableError, UserError
from launch.command import DEFAULT_MASTER_PORT
from launch.diagnose import error_for, is_one_line, tail, without_torchrun_report
from launch.elastic import resized
from launch.job import NODE_MODULE, Info, OnProgress, Phase, PhaseJob
from launch.preflight import probe_node
from launch.watch import phase_watch
from storage.fs import makedirs
from storage.location import is_local, join, local_path
from storage.spec import Attempt, Spec

POLL_S = 2.0
SCRIPTS = "slurm"  # the job scripts and their output, under the run directory
FINAL_OK = {"COMPLETED"}
FINAL_BAD = {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def render_sbatch(job: PhaseJob, *, output: str) -> str:
    """The batch script for one phase of a run."""
    spec, phase = job.written.spec, job.phase
    launch = spec.config.launch
    node_command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", NODE_MODULE, *job.node_args])
    env = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted({**job.env, **launch.env}.items()))
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
        raise UserError(
            f"launch.backend=slurm: {command[0]} not found; run the pipeline on a SLURM login node"
        ) from None
    if done.returncode != 0:
        raise RetryableError(f"{' '.join(command[:2])} failed: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def sbatch_command(script_path: str, launch: LaunchConfig) -> list[str]:
    """The sbatch line. launch.forward_env's values travel in the job environment (this process's, exported with
    --export=ALL unless launch.slurm_args chooses an --export itself), never in the script on shared storage."""
    own = any(arg.startswith("--export") for arg in launch.slurm_args)
    return ["sbatch", "--parsable", *(["--export=ALL"] if launch.forward_env and not own else []), script_path]


def submit(script_path: str, launch: LaunchConfig) -> str:
    """sbatch --parsable: the job id."""
    return run(sbatch_command(script_path, launch)).strip().split(";")[0]


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
    found_state = re.search(r"JobState=(\S+)", shown)
    found_code = re.search(r"ExitCode=(\S+)", shown)
    return (found_state.group(1) if found_state else "UNKNOWN"), (found_code.group(1) if found_code else "")


def _squeue_knows(job_id: str) -> bool:
    done = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=60)
    return done.returncode == 0 and bool(done.stdout.strip())


class SlurmBackend:
    """`launch.backend: slurm`: one sbatch job over launch.nnodes nodes, its script in {run}/slurm/."""

    elastic = False  # the allocation is the job's: no attempt picks the surviving nodes (yet)

    def describe(self, job: PhaseJob) -> str:
        """The sbatch line and the job script."""
        script, output = script_paths(job)
        command = shlex.join(sbatch_command(script, job.written.spec.config.launch))
        return f"# launch.backend=slurm: {command}\n# {script}:\n{render_sbatch(job, output=output)}"

    def submit(self, job: PhaseJob, info: Info) -> SlurmJob:
        """Write the job script next to the run and submit it."""
        spec = job.written.spec
        script, output = script_paths(job)
        makedirs(join(spec.run, SCRIPTS))
        with open(script, "w") as handle:
            handle.write(render_sbatch(job, output=output))
        job_id = submit(script, spec.config.launch)
        info(f"{job.phase}: SLURM job {job_id} submitted ({spec.config.launch.nnodes} nodes, script {script})")
        return SlurmJob(job, job_id, output.replace("%j", job_id))

    def probe(self, spec: Spec, slot: int) -> str | None:
        """Preflight's node-local checks for a slot, on this machine (each node's own preflight follows)."""
        return probe_node(spec, slot)

    def attempt_launch(self, launch: LaunchConfig, attempt: Attempt) -> LaunchConfig:
        """As many nodes as the attempt has (SLURM picks them)."""
        return resized(launch, attempt)


def script_paths(job: PhaseJob) -> tuple[str, str]:
    """The job script and its output pattern, under {run}/slurm/: the run directory must be on a shared filesystem,
    the one place every node and the login node read."""
    spec = job.written.spec
    if not is_local(spec.run):
        raise UserError("launch.backend=slurm needs run.storage on a shared filesystem (NFS) for the job script")
    jobs_dir = join(spec.run, SCRIPTS)
    return local_path(join(jobs_dir, f"{job.phase}.sbatch")), local_path(join(jobs_dir, f"{job.phase}-%j.out"))


@dataclass
class SlurmJob:
    """A submitted phase: the one job, followed with squeue/sacct and cancelled with scancel unless it completed."""

    job: PhaseJob
    job_id: str
    output: str
    finished: bool = False

    def follow(self, on_progress: OnProgress | None) -> None:
        """Until the job completed; raise naming the failure when it ended otherwise."""
        self.finished = _follow(self.job, self.job_id, self.output, on_progress)

    def cancel(self, *, failed: bool) -> None:
        """scancel the job unless it completed (SLURM gives its nodes KillWait; `failed` changes nothing)."""
        if not self.finished:
            subprocess.run(["scancel", self.job_id], capture_output=True, timeout=60)


def _follow(job: PhaseJob, job_id: str, output: str, on_progress: OnProgress | None) -> bool:
    """Poll the job until it completed (True); raise naming the failure when it ended otherwise."""
    spec, watch = job.written.spec, None
    while True:
        state, code = job_state(job_id)
        if state in FINAL_OK:
            return True
        if state in FINAL_BAD:
            raise _failure(job.phase, job_id, state, code, output)
        if state == "RUNNING" and on_progress is not None:
            if watch is None:  # time in the queue is not a stall: start the clock when it runs
                watch = phase_watch(spec.run, spec.config.launch, job.phase, on_progress)
            watch.poll()  # type: ignore[union-attr]
        time.sleep(POLL_S)


def _failure(phase: Phase, job_id: str, state: str, code: str, output: str) -> UserError | RetryableError:
    """The error of a job that ended badly: the nodes' first error line and the end of the job's output."""
    text = _read(output)
    errors = [line[len("error: ") :] for line in text.splitlines() if line.startswith("error: ")]
    said = errors[0] if errors else "no error line from the nodes"
    message = f"{phase}: SLURM job {job_id} ended {state} (exit {code}): {said}"
    if not is_one_line(said):
        message += f"\nlast lines of {output}:\n{tail(without_torchrun_report(text), 10)}"
    exit_code = code.split(":")[0]
    return error_for(int(exit_code) if exit_code.isdigit() else None, message)


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as handle:
            return handle.read()
    except OSError:
        return "(no output file)\n"
