"""Plot the loss curve of a run into {run}/loss.png."""

from __future__ import annotations

from prefect import get_run_logger, task

from pipeline.loss_curve import write_loss_plot
from storage.location import Location


@task(name="plot-loss")
def plot_loss(run_url: Location, step: int, eval_loss: float, title: str) -> Location | None:
    """The loss curve of the run, with the evaluated model's loss at its step."""
    url = write_loss_plot(run_url, [(step, eval_loss)], title)
    get_run_logger().info("loss curve: %s", url or "no train losses in metrics.jsonl")
    return url
