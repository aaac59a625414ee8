"""One node of a job, whatever started it (a thread of the local backend, the `node` flow a Prefect worker runs, srun,
ssh, a pod, by hand): its claim on its rank, preflight before training, then the node's torchrun agent, supervised
until it exits. A node that fails records why in its status.json and leaves the note that stops the other nodes
(launch/claim.py).

Every node process runs this module, `python -m launch.node` (srun, ssh, a pod; `tandem node` by hand), which imports
no Prefect. By hand (or from another scheduler), exactly like Qwen's finetune_lora_ds.sh reads its variables:

    NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.5 MASTER_PORT=6001 python -m launch.node --spec SPEC   # on node 0
    NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.5 MASTER_PORT=6001 python -m launch.node --spec SPEC   # on node 1

Defaults: NNODES=1, NODE_RANK=0, MASTER_ADDR=localhost, MASTER_PORT=6001, GPUS_PER_NODE=all visible GPUs (on a
machine without GPUs: launch.nproc_per_node of the spec). In a Kubeflow Trainer TrainJob's pod the PET_* variables its
controller injects stand in for unset ones, and in an indexed Job's pod JOB_COMPLETION_INDEX is the node rank
(launch/node_env.py reads them). `--dry-run` prints this node's place and the torchrun line it would start, and starts
nothing. Two hosts started with the same NODE_RANK both stop within seconds, naming each other; when one node fails,
the others stop within seconds too ({run}/nodes/stop.json). `--phase probe` runs the preflight and the network probe
only (no training): a quick test of the links between the nodes. `--phase eval --model LOCATION` evaluates a model.

Exit codes: 0 done, 2 bad config, data or arguments (a retry cannot help), 75 retryable, 1 anything else.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import threading
from collections.abc import Callable, Mapping

from config.sections.launch import LaunchConfig
from core.checkout import PROJECT_ROOT
from core.errors import EXIT_USER_ERROR, TandemError
from core.redact import install_log_masking, mask_text
from launch.agent import Agent, grace_for, kill, start_agent, supervise_agent
from launch.claim import NodeClaim
from launch.command import environment_lines, rank_environment, torchrun_command
from launch.job import NODE_MODULE, PHASES, TRAIN, Info, NodePlan, Phase, PhaseJob, phase_argument
from launch.liveness import PipelineWatch
from launch.network import source_address
from launch.node_env import node_job, plan_from_environment
from launch.preflight import run_preflight
from launch.supervise import Poller, poll_each
from storage import layout
from storage.fs import exists, read_json, write_json_atomic
from storage.full import full_storage_is_one_line
from storage.location import ARGUMENT_FORM, Location, join, location_argument

log = logging.getLogger(__name__)
# status.json's record of why a node failed: the exit code of its error (2: retrying cannot help).
ERROR_EXIT_CODE = "error_exit_code"


class NodeStopped(Exception):
    """A node's launcher stopped it (not a failure of the node: nothing is recorded for it)."""


class NodeStop:
    """How a launcher that runs a node in its own process (the local backend: one thread per node) stops it, and what
    it learns back: `trip` makes the node's loop raise NodeStopped and its agent get `grace_s`."""

    def __init__(self) -> None:
        self._tripped = threading.Event()
        self.grace_s: float | None = None  # set by trip
        self.by_peer = False  # set by run_node: the node failed because another node did (it read that one's note)

    def trip(self, grace_s: float) -> None:
        """Stop the node, its agent getting `grace_s` between SIGTERM and SIGKILL."""
        if not self._tripped.is_set():
            self.grace_s = grace_s
            self._tripped.set()

    def poll(self) -> None:
        """Raise NodeStopped once tripped (called by the node's loops)."""
        if self._tripped.is_set():
            raise NodeStopped("stopped by its launcher")


def start_node(
    run_url: Location,
    plan: NodePlan,
    launch: LaunchConfig,
    module: str,
    args: list[str],
    phase: Phase,
    preflight: Callable[[NodePlan], object] | None,
    env: Mapping[str, str] | None = None,
) -> Agent:
    """Preflight this node (when given a preflight), then start its torchrun agent, `env` added to its ranks'
    environment."""
    if preflight is not None:
        preflight(plan)
    return start_agent(run_url, plan, launch, module, args, phase, env)


def describe_node(job: PhaseJob, plan: NodePlan) -> str:
    """What `run_node` runs on this machine for `job` at `plan`'s place, for a dry run: the steps before its agent,
    the variables the agent's ranks get beyond this process's environment (launch/command.py `rank_environment`), and
    the agent's torchrun line (launch/agent.py `start_agent`)."""
    spec = job.written.spec
    launch = spec.config.launch
    env = rank_environment(launch, plan.master_addr, job.env)
    added = {name: value for name, value in env.items() if os.environ.get(name) != value}
    steps = "claims its rank, preflight, then starts" if job.phase.preflights else "claims its rank, starts"
    command = torchrun_command(plan, launch.rdzv_timeout, job.module, job.args)
    return "\n".join(
        [
            f"# node {plan.node_rank} of {plan.nnodes}: {steps} one torchrun agent of {plan.nproc_per_node} rank(s), "
            f"rendezvous {plan.master_addr}:{plan.master_port}",
            f"cd {shlex.quote(str(PROJECT_ROOT))} && env \\",
            *(f"  {line} \\" for line in environment_lines(added, launch)),
            f"  {shlex.join(command)}",
        ]
    )


def job_preflight(
    job: PhaseJob, info: Info, poll: Callable[[], None] | None = None
) -> Callable[[NodePlan], object] | None:
    """The preflight of a job's nodes: every check before training (and the probe alone), none before eval."""
    if not job.phase.preflights:
        return None
    written = job.written
    return lambda plan: run_preflight(
        written.spec, written.url, plan, expected_spec_digest=written.digest, info=info, poll=poll
    )


def run_node(job: PhaseJob, plan: NodePlan, info: Info | None = None, *, stop: NodeStop | None = None) -> None:
    """Claim the rank, preflight (training) and run this node's agent until it exits; raise naming the failure. A
    failure is also recorded in the node's status.json by its exit code, for a pipeline that follows this node from
    elsewhere, and in the note that stops the other nodes. `stop`: how a launcher in this process stops the node."""
    info = info or log.info
    spec = job.written.spec
    clear_failure(spec.run, plan.node_rank)
    claim = NodeClaim(spec.run, plan.node_rank, plan.nnodes, _address_towards(plan.master_addr))
    # The launcher's stop first; the claim's renewal raises on a duplicate rank or another node's failure. A node
    # process of its own follows the pipeline's liveness record (a local node thread dies with the pipeline).
    pollers: list[Poller] = [stop, claim] if stop is not None else [claim, PipelineWatch(spec.run)]
    try:
        claim.take()
        agent = start_node(
            spec.run,
            plan,
            spec.config.launch,
            job.module,
            job.args,
            job.phase,
            job_preflight(job, info, lambda: poll_each(pollers)),
            job.env,
        )
        info(
            f"node {plan.node_rank}/{plan.nnodes}: {job.phase} started, {plan.nproc_per_node} rank(s), "
            f"rendezvous {plan.master_addr}:{plan.master_port}"
        )
        try:
            supervise_agent(agent, spec, job.phase, pollers)
        finally:
            kill([agent], kill_grace(spec.config.launch, claim, stop))
    except TandemError as exc:
        error = node_failure(job, plan, claim, exc)
        if stop is not None:
            stop.by_peer = claim.stopped_by_peer or error is not exc
        if error is not exc:
            raise error from exc
        raise
    finally:
        claim.release()
    info(f"node {plan.node_rank}: {job.phase} finished")


def kill_grace(launch: LaunchConfig, claim: NodeClaim, stop: NodeStop | None) -> float:
    """The grace of the node's agent: the one its launcher stopped it with; a failure's when a launcher in this
    process follows the node and another node failed (the launcher reports that failure: the phase failed); else a
    cancel's (a node started on its own keeps it for a peer's note too: the note may come from a duplicate rank that
    never joined, and the ranks may still save on SIGTERM)."""
    if stop is not None and stop.grace_s is not None:
        return stop.grace_s
    return grace_for(launch, failed=stop is not None and claim.stopped_by_peer)


def node_failure(job: PhaseJob, plan: NodePlan, claim: NodeClaim, exc: TandemError) -> TandemError:
    """The error a failed node raises (its own, or the peer's that caused it), after leaving the note that stops the
    other nodes (for its own failure) and recording the error's exit code in status.json."""
    error = exc if claim.stopped_by_peer else root_cause(claim, exc)
    if error is exc and not claim.stopped_by_peer:
        claim.stop_all(str(exc).partition("\n")[0], exc.exit_code)
    try:
        record_failure(job.written.spec.run, plan.node_rank, job.phase, error.exit_code)
    except Exception as failed:  # noqa: BLE001 - the node's own error is the one to raise
        log.warning("node %d: could not record its failure in status.json: %s", plan.node_rank, failed)
    return error


def root_cause(claim: NodeClaim, error: TandemError) -> TandemError:
    """This node's error, or a peer's that caused it: a peer that cannot be retried (a duplicate rank, bad data)
    stops its agent, and this node's ranks may lose their connections before this node reads the peer's note."""
    if error.exit_code == EXIT_USER_ERROR:
        return error
    try:
        peer = claim.stopped_by()
    except Exception:  # noqa: BLE001 - storage unreadable: this node's own error stands
        return error
    return peer if peer is not None and peer.exit_code == EXIT_USER_ERROR else error


def _address_towards(master_addr: str) -> str:
    try:
        return source_address(master_addr)
    except OSError:
        return ""


def record_failure(run_url: Location, node_rank: int, phase: Phase, exit_code: int) -> None:
    """Add the exit code of a node's error to its status.json (written there when its agent exited)."""
    url = status_url(run_url, node_rank)
    status = read_json(url) if exists(url) else {"node_rank": node_rank}
    write_json_atomic(url, {**status, "phase": phase.name, ERROR_EXIT_CODE: exit_code})


def clear_failure(run_url: Location, node_rank: int) -> None:
    """Forget the failure an earlier attempt of this node recorded."""
    url = status_url(run_url, node_rank)
    if exists(url) and ERROR_EXIT_CODE in (status := read_json(url)):
        write_json_atomic(url, {k: v for k, v in status.items() if k != ERROR_EXIT_CODE})


def failure_exit_code(run_url: Location, node_rank: int) -> int | None:
    """The exit code a failed node recorded (None when it recorded none: it may not have got that far)."""
    url = status_url(run_url, node_rank)
    return read_json(url).get(ERROR_EXIT_CODE) if exists(url) else None


def status_url(run_url: Location, node_rank: int) -> Location:
    """{run}/nodes/{rank}/status.json: how the node's agent ended (launch/agent.py)."""
    return join(layout.node_dir(run_url, node_rank), layout.STATUS)


def recorded_end(run_url: Location, node_rank: int, phase: Phase) -> int | None:
    """How this node's agent ended this phase by its own record: 0 when it finished well, its error's exit code (or
    its agent's) when it failed, None while it has recorded no end (or storage cannot say)."""
    try:
        url = status_url(run_url, node_rank)
        status = read_json(url) if exists(url) else None
    except Exception:  # noqa: BLE001 - storage unreadable too: no news
        return None
    if status is None or status.get("phase") != phase.name or status.get("exit_code") is None:
        return None
    return status.get(ERROR_EXIT_CODE) or status["exit_code"]


def node_parser() -> argparse.ArgumentParser:
    """The command line of `python -m launch.node` (and of `tandem node`, `python -m flows.node`)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {NODE_MODULE}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--spec",
        required=True,
        type=location_argument,
        help=f"the run's spec.json (written by flows.finetune or flows.prepare --write-spec): {ARGUMENT_FORM}",
    )
    parser.add_argument("--phase", type=phase_argument, default=TRAIN, help=f"one of {', '.join(PHASES)}")
    parser.add_argument(
        "--model",
        type=location_argument,
        default=None,
        help=f"the model to evaluate (--phase eval), final/ or checkpoints/step-N of the run: {ARGUMENT_FORM}",
    )
    parser.add_argument("--spec-digest", default=None, help="sha256 the pipeline recorded for spec.json (checked)")
    parser.add_argument("--dry-run", action="store_true", help="print what this node would run, then exit")
    return parser


def one_line_errors(body: Callable[[], None]) -> int:
    """Run `body`: 0, or a TandemError (a full disk among them) as one line on stderr and its exit code, never a
    traceback; Ctrl-C is 130."""
    install_log_masking()
    try:
        with full_storage_is_one_line():
            body()
        return 0
    except TandemError as exc:
        first_line, _, rest = mask_text(str(exc)).partition("\n")
        print(f"error: {first_line}", file=sys.stderr)
        if rest:
            print(rest, file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    """CLI entry: run this node of the job described by --spec (or only print it, --dry-run)."""
    parser = node_parser()
    args = parser.parse_args(argv)
    if args.model is not None and not args.phase.takes_model:
        parser.error(f"--model: --phase {args.phase} evaluates no model; leave --model out")
    if args.model is None and args.phase.takes_model:
        parser.error(f"--phase {args.phase} needs --model, the model to evaluate (final/ or checkpoints/step-N)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", force=True)

    def body() -> None:
        job = node_job(args.spec, args.phase, args.model, args.spec_digest)
        plan = plan_from_environment(job.written.spec.config.launch.nproc_per_node)
        if args.dry_run:
            print(describe_node(job, plan))
        else:
            run_node(job, plan)

    return one_line_errors(body)


if __name__ == "__main__":
    sys.exit(main())
