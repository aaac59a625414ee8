"""The fine-tuning pipeline: prepare -> train on every node -> COMPLETE -> evaluate -> register.

    python -m flows.finetune                      # the embedded default: tiny model, 2 local nodes, CPU
    python -m flows.finetune --config qwen-7b-lora --set run.storage=/mnt/shared/tandem
    python -m flows.finetune --set train.max_steps=100 --set launch.nnodes=3
    python -m flows.finetune --set register.gate="{metric: loss, direction: min, threshold: 2.0}"
    python -m flows.finetune --set launch.nnodes=3 --print-config   # the resolved config as YAML, nothing run
    python -m flows.finetune --set launch.backend=slurm --dry-run   # what each phase would start, nothing run

Without PREFECT_API_URL, Prefect starts a temporary local server for the run.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from prefect import flow, get_run_logger, runtime
from prefect.exceptions import CancelledRun
from prefect.states import Cancelled, Completed

from config.schema import FinetuneConfig
from flows.cli import add_config_arguments, enter, run_config_cli
from flows.hangup import Hangup, cancel_on_hangup, from_the_command_line, received
from flows.prepare import stage_inputs
from pipeline.lineage import lineage
from pipeline.models import registry_name
from pipeline.plan import new_run_id
from storage import layout
from storage.checkpoints import CompleteCheckpoint
from storage.location import Location, join
from storage.metrics import (
    delta_metrics,
    eval_metric_keys,
    eval_record,
    generate_metrics,
    read_metrics,
    task_metrics,
)
from storage.run_lock import RunLock
from storage.spec import WrittenSpec
from tasks.assets import record_model_asset
from tasks.evaluate import evaluate_on_nodes
from tasks.loss_curve import plot_loss
from tasks.register import Registration, register_model
from tasks.run import write_run_spec
from tasks.track import link_tracking, mirror_registry
from tasks.train import train_with_retries
from tasks.wait import wait_for_checkpoint
from tracking import check_tracking, links, resolved_params, run_tags, tracking, wait_opened
from tracking.sink import RunInfo, Tracker


def last_train_loss(run: Location) -> float | None:
    """The loss of the last step line of metrics.jsonl (event lines such as final_eval are not steps)."""
    steps = [record for record in read_metrics(run) if "event" not in record]
    return steps[-1]["loss"] if steps else None


@flow(name="finetune", log_prints=True)
def finetune(config: FinetuneConfig = FinetuneConfig()) -> dict[str, Any]:  # noqa: B008 - the UI form's defaults
    """Fine-tune a model on every node and register it with its metrics and lineage."""
    cancel_on_hangup()  # before anything starts: SIGHUP and SIGTERM unwind the run as a cancel from here on
    logger = get_run_logger()
    cfg = enter(config)
    check_tracking(cfg)  # an unreachable MLflow server stops the run here, before anything is written
    run_id = new_run_id(cfg)
    logger.info(
        "run %s: %s, %d node(s) x %d rank(s), storage %s",
        run_id,
        cfg.train.method,
        cfg.launch.nnodes,
        cfg.launch.nproc_per_node,
        cfg.run.storage,
    )
    flow_run_id = str(runtime.flow_run.id) if runtime.flow_run.id else None
    # Before anything touches the run directory: a second pipeline on the same run.name stops here.
    run = layout.run_dir(cfg.run, run_id)
    try:
        with (
            RunLock(run, run_id, flow_run_id, logger=logger).hold(take_over=cfg.run.take_over),
            tracking(cfg, RunInfo(run_id, run, flow_run_id, runtime.flow_run.ui_url)) as tracker,
        ):
            return pipeline(cfg, run_id, tracker)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGHUP/SIGTERM (flows/hangup.py): every node has stopped by now
        how = "Ctrl-C" if not isinstance(exc, Hangup) else str(exc)
        saved = " after saving a checkpoint" if cfg.launch.checkpoint_on_cancel else ""
        message = f"run {run_id} cancelled by {how}: its nodes stopped{saved}; run it again to resume"
        logger.warning(message)
        cancelled: Any = Cancelled(message=message)  # a returned state is the flow run's final state
        return cancelled


def pipeline(cfg: FinetuneConfig, run_id: str, tracker: Tracker) -> Any:
    """The steps of a run whose lock this flow holds; `tracker` mirrors them into the tracking systems."""
    model_path, dataset = stage_inputs(cfg)
    written = write_run_spec(cfg, run_id, model_path, dataset)
    params = resolved_params(written.spec)
    tracker.call(lambda sink: sink.log_params(params))
    if tracker.workers:
        wait_opened(tracker)
        link_tracking(run_id, links(tracker))
    # An elastic run may finish training on other nodes than it started on: the rest follows the last attempt.
    written = train_with_retries(written.spec)(written, tracker)
    spec = written.spec
    tracker.steps(read_metrics(spec.run))  # the steps written after the last progress read, and any retry's
    checkpoint = wait_for_checkpoint(spec.run, spec.total_steps)
    model_url = layout.final_dir(spec.run)
    evaluated = checkpoint.url if cfg.eval.model == "checkpoint" else model_url
    metrics = evaluate_on_nodes(written, evaluated)
    loss_plot = plot_loss(spec.run, checkpoint.step, metrics["loss"], f"{registry_name(cfg)}, run {run_id}")
    registered = register_model(written, checkpoint, model_url, metrics, loss_plot)
    if registered.registered:
        record_model_asset(spec, registered)
    if (mlflow_uri := cfg.track.mlflow_tracking_uri()) is not None:  # a rejected gate mirrors nothing new
        mirror_registry(layout.root(cfg.run), registry_name(cfg), mlflow_uri)
    track_results(tracker, written, checkpoint, metrics, loss_plot, registered)
    summary = {
        "run_id": run_id,
        "run_url": str(spec.run),
        "dataset_id": dataset.dataset_id,
        "train_loss": last_train_loss(spec.run),
        "eval": eval_record(metrics),
        "checkpoint_url": str(checkpoint.url),
        "model_url": str(model_url),
        "loss_plot": str(loss_plot) if loss_plot else None,
        "registered": registered.registered,
        "registration": registered.message,
        "registry_url": registered.url,
    }
    # The run ends Completed whether or not the gate passed; its state message says which (the UI shows
    # it), and callers of finetune() receive the summary.
    message = f"registered {registered.message}" if registered.registered else registered.message
    return Completed(message=message, data=summary)


def track_results(
    tracker: Tracker,
    written: WrittenSpec,
    checkpoint: CompleteCheckpoint,
    metrics: dict[str, Any],
    loss_plot: Location | None,
    registered: Registration,
) -> None:
    """Queue the run's results for the tracking systems: eval metrics at the evaluated step, lineage and attempts as
    tags, the loss curve and the model card as files."""
    spec = written.spec
    evals = {f"eval/{key}": float(metrics[key]) for key in eval_metric_keys(metrics)}
    figures = generate_metrics(metrics) | task_metrics(metrics) | delta_metrics(metrics)
    evals |= {f"eval/{key}": value for key, value in figures.items()}
    tags = {**run_tags(spec, lineage(spec, written.digest, checkpoint)), "tandem.registered": registered.message}
    tracker.call(lambda sink: sink.log_metrics(evals, checkpoint.step))
    tracker.call(lambda sink: sink.set_tags(tags))
    if loss_plot:
        tracker.call(lambda sink: sink.log_file(loss_plot, layout.LOSS_PLOT))
    if registered.registered:
        card = join(spec.run, layout.MODEL_CARD)
        tracker.call(lambda sink: sink.log_file(card, layout.MODEL_CARD))


def eval_rows(ev: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary's eval lines besides the loss: supervised or preference metrics, as the evaluation measured."""
    if "reward" in ev and "reward_accuracy" not in ev:  # online RL: eval loss is minus the reward
        return [("reward", f"{ev['reward']:.4f} ({ev['records']} eval answers)")]
    if "reward_accuracy" in ev:
        return [
            ("reward acc.", f"{ev['reward_accuracy']:.4f} ({ev['units']} eval units)"),
            ("reward margin", f"{ev['reward_margin']:.4f}"),
        ]
    return [
        ("perplexity", f"{ev['perplexity']:.2f}"),
        ("token accuracy", f"{ev['token_accuracy']:.4f} ({ev['target_tokens']} target tokens)"),
    ]


def print_summary(summary: dict[str, Any]) -> None:
    """The CLI's final summary (the one place a bare print is right)."""
    ev = summary["eval"]
    train_loss = summary["train_loss"]
    rows = [
        ("run", summary["run_id"]),
        ("train loss", f"{train_loss:.4f}" if train_loss is not None else "n/a"),
        ("eval loss", f"{ev['loss']:.4f}"),
        *eval_rows(ev),
        ("checkpoint", summary["checkpoint_url"]),
        ("model", summary["model_url"]),
        ("loss curve", summary["loss_plot"] or "n/a"),
    ]
    if summary["registered"]:
        rows.append(("registered", f"{summary['registration']} ({summary['registry_url']})"))
    else:
        rows.append(("registered", summary["registration"]))
    print("\n" + "\n".join(f"{name:<15}{value}" for name, value in rows))


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m flows.finetune", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_config_arguments(parser)
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print the run's memory plan (per GPU, and per node's host) and what it writes, then exit; runs nothing",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print what the run's launch backend would start for each phase (the torchrun lines, the node flow "
        "runs, the sbatch script, the ssh commands, the Kubernetes objects), then exit; starts and writes nothing",
    )
    args = parser.parse_args(argv)

    def body(cfg: FinetuneConfig) -> int:
        if args.dry_run:
            from launch.dry_run import dry_run_text

            print(dry_run_text(cfg), end="")
            return 0
        if args.plan:
            from launch.preflight import visible_gpus
            from pipeline.memory import plan_text

            print(plan_text(cfg, on_gpu=True))
            if cfg.launch.backend == "local" and visible_gpus() == 0:
                print("\nthis machine has no GPU: its local ranks run on the CPU")
                print(plan_text(cfg, on_gpu=False))
            return 0
        from_the_command_line()
        try:
            summary = finetune(cfg)
        except CancelledRun as exc:
            print(f"cancelled: {exc}", file=sys.stderr)
            signum = received()
            return 128 + signum if signum is not None else 130
        print_summary(summary)
        return 0

    return run_config_cli(args, args.overrides, body)


if __name__ == "__main__":
    sys.exit(main())
