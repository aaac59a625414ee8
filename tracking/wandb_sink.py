"""The Weights & Biases sink: one W&B run per Tandem run (its id derived from the run_id, resumed by a retry).

W&B is an optional extra (`pip install 'tandem[wandb]'`); credentials and mode come from W&B's own environment
(`WANDB_API_KEY`, `WANDB_MODE=offline` to write only local files, `WANDB_BASE_URL` for a self-hosted server). Its
local files go under {run}/wandb/ on a local storage root (W&B's own folder otherwise).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from storage.fs import makedirs
from storage.location import Location, is_local, join, local_path
from tracking.sink import RunInfo, require, step_metrics

WANDB_DIR = "wandb"


def import_wandb() -> Any:
    """The wandb module, or one line naming the extra that provides it."""
    return require("wandb", "Weights & Biases", "track.wandb", "false")


def wandb_id(run_id: str) -> str:
    """A W&B run id for a Tandem run id (W&B allows letters, digits, - and _, up to 64 characters)."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "-", run_id)
    return clean if len(clean) <= 64 else f"{clean[:47]}-{hashlib.sha256(run_id.encode()).hexdigest()[:16]}"


class WandbSink:
    """Mirrors a Tandem run into one W&B run of `project`."""

    name = "W&B"

    def __init__(self, project: str) -> None:
        self.wandb = import_wandb()
        self.project = project
        self.run: Any = None

    def open(self, run: RunInfo) -> int:
        """Start (or resume, with the same id) the W&B run; returns the last step it holds."""
        directory = None
        if is_local(run.run_url):
            makedirs(join(run.run_url, WANDB_DIR))
            directory = local_path(run.run_url)
        self.run = self.wandb.init(
            project=self.project,
            id=wandb_id(run.run_id),
            name=run.run_id,
            resume="allow",
            dir=directory,
            reinit="create_new",
            tags=["tandem"],
            notes=run.flow_run_url or None,
        )
        self.run.config.update(
            {"tandem.run_url": str(run.run_url), "prefect.flow_run_id": run.flow_run_id}, allow_val_change=True
        )
        return max(int(self.run.step) - 1, 0)

    @property
    def link(self) -> str | None:
        """The run's page (online runs only)."""
        return self.run.url if self.run is not None and not self.run.offline else None

    def log_params(self, params: Mapping[str, str]) -> None:
        """The flattened config as W&B's run config."""
        self.run.config.update(dict(params), allow_val_change=True)

    def log_steps(self, records: list[dict[str, Any]]) -> None:
        """train/* at each step."""
        for record in records:
            self.run.log(step_metrics(record), step=record["step"])

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Metrics at one step (W&B refuses steps below its current one: the eval step is the last train step)."""
        self.run.log({key: float(value) for key, value in metrics.items()}, step=max(step, int(self.run.step)))

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Tags (lineage digests) as summary values: W&B's tags are short labels."""
        for key, value in tags.items():
            self.run.summary[key] = value

    def log_file(self, url: Location, name: str) -> None:
        """Files stay in Tandem's run directory (W&B shows metrics and config)."""

    def close(self, status: str) -> None:
        """Finish the run (exit code 1 for a failed pipeline)."""
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)
