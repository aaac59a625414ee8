"""Train: preflight every node, run the trainer on each, follow progress, and wait for all of them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast
from uuid import UUID

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext
from prefect.states import State

from core.errors import RetryableError, TooFewNodes
from launch.api_outage import fail_fast, unreachable
from launch.command import transport_debug_env
from launch.elastic import attempt_on, is_elastic
from launch.job import TRAIN
from launch.phase import backend_for, run_phase
from pipeline.plan import build_spec
from storage import layout
from storage.checkpoints import latest_complete, verified_export_step
from storage.spec import Spec, WrittenSpec, load_spec, publish_spec
from tracking.sink import Tracker


# Never a cached result: training must run (a run already trained says so itself), and the tracker (threads) has no
# hash to key a cache by.
@task(name="train", cache_policy=NO_CACHE)
def train_on_nodes(written: WrittenSpec, tracker: Tracker | None = None) -> WrittenSpec:
    """Preflight every node, launch `python -m trainer` on each; returns when all ranks finished, with the spec the
    job finished under (an elastic run's attempt may have other nodes than the first). `tracker`: the run's, which
    the flow hands in, fed each new step. A run already trained to its last step launches nothing."""
    logger = get_run_logger()
    spec = written.spec
    if trained_to_the_end(spec):
        logger.info(
            f"train: {spec.run} is already trained to step {spec.total_steps} (its checkpoint and final/ "
            "are complete); no node is started. train.resume=never or a new run.name trains again"
        )
        return written
    on_progress = progress_reporter(spec.total_steps, logger.info, tracker)
    context = TaskRunContext.get()
    if context is None or context.task_run.run_count <= 1:
        return train_attempts(written, logger.info, on_progress)
    logger.info(
        "train: a retry after a failure: the ranks log their transport (NCCL_DEBUG=INFO, "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL, TORCH_CPP_LOG_LEVEL=INFO) to the nodes' logs"
    )
    return train_attempts(written, logger.info, on_progress, env=transport_debug_env())


def train_attempts(
    written: WrittenSpec,
    info: Callable[[str], None],
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    env: dict[str, str] | None = None,
) -> WrittenSpec:
    """Run the train phase (`env` added to the ranks' environment); an elastic run first picks its nodes, and when the
    cluster starts fewer of them than asked (TooFewNodes: pods its scheduler could not place in time) it starts again
    at once on as many, down to launch.min_nnodes. Returns the spec the phase finished under."""
    elastic = is_elastic(written.spec.config)
    if elastic:
        written = start_attempt(written, info)
    while True:
        try:
            run_phase(written, TRAIN, info, on_progress=on_progress, env=env)
            return written
        except TooFewNodes as short:
            # fewer than the attempt had, and no fewer than the least the run may use; so every turn shrinks
            if not elastic or not written.spec.config.node_range[0] <= short.nodes < written.spec.config.launch.nnodes:
                raise
            info(f"train: {short}; the elastic run starts again on the {short.nodes} node(s) the cluster can place")
            written = start_attempt(written, info, short)


def start_attempt(written: WrittenSpec, info: Callable[[str], None], cap: TooFewNodes | None = None) -> WrittenSpec:
    """Pick the nodes of this attempt of an elastic run (at most `cap.nodes` after one the cluster could not place
    whole) and write its spec.json (launch.nnodes and the world size of the attempt, the history of attempts);
    returns it."""
    base = written.spec
    previous = load_spec(written.url)[0].attempts  # what earlier attempts of this pipeline run recorded
    attempt, launch = attempt_on(backend_for(base.config.launch.backend), base, previous, cap)
    cfg = base.config.model_copy(update={"launch": launch})
    spec = build_spec(
        cfg, base.run_id, base.model_path, base.dataset, base.model_manifest_digest, base.rewards
    ).model_copy(update={"attempts": [*previous, attempt]})
    info(f"train: {attempt.describe()}; global batch {cfg.batch_text(spec.world_size)}")
    return publish_spec(spec)


def trained_to_the_end(spec: Spec) -> bool:
    """Whether starting the nodes could do nothing: with train.resume=auto they would resume from the checkpoint of
    the last step and find final/ exported for it. (A rerun of a finished run, to evaluate or register again.)"""
    if spec.config.train.resume != "auto":
        return False
    newest = latest_complete(spec.run)
    return (
        newest is not None
        and newest.step == spec.total_steps
        and verified_export_step(layout.final_dir(spec.run)) == spec.total_steps
    )


def retry_only_retryable(_task: object, _task_run: object, state: State) -> bool:
    """Prefect's retry condition: retry lost nodes, stalls and timeouts, never bad config or data."""
    try:
        state.result(raise_on_failure=True)
    except RetryableError:
        return True
    except Exception:  # noqa: BLE001 - anything else (UserError above all) is not worth a retry
        return False
    return False


def train_with_retries(spec: Spec) -> Any:
    """The train task with the run's retry policy (launch.retries); a retry resumes (train.resume=auto)."""
    launch = spec.config.launch
    return train_on_nodes.with_options(
        retries=launch.retries, retry_delay_seconds=launch.retry_delay_s, retry_condition_fn=retry_only_retryable
    )


def progress_line(record: dict[str, Any], total: int, eta: float) -> str:
    """A step's progress line: step/total, loss, tokens, tokens/s and ETA; online RL's mean reward and the share of
    the step spent generating its rollouts."""
    line = (
        f"step {record['step']}/{total} loss {record['loss']:.4f} tokens {record['tokens']} tokens/s "
        f"{record['tokens_per_s']:.0f}"
    )
    if record.get("reward") is not None:
        share = record.get("generation_s", 0.0) / max(record["step_time_s"], 1e-9)
        line += f" reward {record['reward']:.4f} generation {share:.0%} of the step"
    return f"{line} ETA {eta:.0f} s"


def progress_reporter(
    total: int, info: Callable[[str], None], tracker: Tracker | None = None
) -> Callable[[dict[str, Any]], None]:
    """A callback that logs step/total, loss, tokens, tokens/s and ETA, keeps a Prefect progress artifact, and hands
    each step to the run's tracker (which only queues it: the tracking systems are fed in the background)."""
    # Called from synchronous code, Prefect returns the artifact's id (its type also admits a coroutine).
    artifact = cast(
        UUID, create_progress_artifact(progress=0.0, key="training-progress", description="training steps done")
    )
    started = time.monotonic()

    def report(record: dict[str, Any]) -> None:
        step = record["step"]
        eta = (time.monotonic() - started) / step * (total - step)
        info(progress_line(record, total, eta))
        try:
            with fail_fast():  # the API away (launch/api_outage.py): this step is not shown, the next one is
                update_progress_artifact(artifact_id=artifact, progress=100.0 * step / total)
        except Exception as exc:
            if not unreachable(exc):
                raise
        if tracker is not None:
            tracker.steps([record])

    return report
