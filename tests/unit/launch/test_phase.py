"""The registry of backends and one phase through it (launch/phase.py): every name the config allows maps to an object
with the whole interface, and `run_phase` renews the pipeline's liveness record while the backend's submission runs,
hands the backend the job it was asked for (the job's environment included) and removes the record after, however
the phase ended. The backend here is a stand-in that records what it got; the real ones run in the suites."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from config.loader import load_config
from config.sections.launch import LaunchConfig
from core.errors import RetryableError
from launch import phase
from launch.backend import Backend
from launch.job import Info, OnProgress, PhaseJob
from launch.liveness import record_url
from pipeline.plan import build_spec
from storage.fs import exists
from storage.spec import DatasetRef, WrittenSpec, publish_spec


def test_every_backend_the_config_allows_is_registered_with_the_whole_interface() -> None:
    allowed = set(typing.get_args(LaunchConfig.model_fields["backend"].annotation))
    registered = phase.backends()
    assert set(registered) == allowed
    for name in allowed:
        backend = phase.backend_for(name)
        for method in ("describe", "submit", "probe", "attempt_launch"):
            assert callable(getattr(backend, method, None)), (name, method)
            assert list(typing.get_type_hints(getattr(backend, method))) == list(
                typing.get_type_hints(getattr(Backend, method))
            ), (name, method)


@dataclass
class Recording:
    """A backend and its submission in one: records the job and whether the pipeline's record was there."""

    error: BaseException | None = None
    jobs: list[PhaseJob] = field(default_factory=list)
    beating: list[bool] = field(default_factory=list)
    cancelled: list[bool] = field(default_factory=list)

    def submit(self, job: PhaseJob, info: Info) -> Recording:
        self.jobs.append(job)
        return self

    def follow(self, on_progress: OnProgress | None) -> None:
        self.beating.append(exists(record_url(self.jobs[-1].written.spec.run)))
        if self.error is not None:
            raise self.error

    def cancel(self, *, failed: bool) -> None:
        self.cancelled.append(failed)


def written(tmp_path: Path) -> WrittenSpec:
    cfg = load_config(None, [f"run.storage={tmp_path}", "train.max_steps=4"])
    dataset = DatasetRef(dataset_id="d", url=str(tmp_path), manifest_digest="x", split_records={"train": 10})
    return publish_spec(build_spec(cfg, "r", str(tmp_path), dataset))


@pytest.mark.parametrize("error", [None, RetryableError("node 1 lost")])
def test_a_phase_runs_under_the_pipelines_liveness_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException | None
) -> None:
    backend = Recording(error)
    monkeypatch.setattr(phase, "backend_for", lambda name: backend)
    spec = written(tmp_path)
    if error is None:
        phase.run_phase(spec, "eval", lambda _: None, model_url="/m", env={"NCCL_DEBUG": "INFO"})
    else:
        with pytest.raises(RetryableError):
            phase.run_phase(spec, "eval", lambda _: None, model_url="/m", env={"NCCL_DEBUG": "INFO"})
    (job,) = backend.jobs
    assert (job.written, job.phase, job.model_url, dict(job.env)) == (spec, "eval", "/m", {"NCCL_DEBUG": "INFO"})
    assert backend.beating == [True] and backend.cancelled == [error is not None]
    assert not exists(record_url(spec.spec.run))  # removed once the phase ended: the nodes stop on their own
