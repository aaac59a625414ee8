"""The registry of backends and one phase through it (launch/phase.py): every name the config allows maps to an object
with the whole interface, a run's config is held to what its backend can do (`run_backend`: an elastic node range on a
backend that needs every node back is one line, exit code 2, from every command that loads the config, before
anything starts), and `run_phase` renews the pipeline's liveness record while the backend's submission runs, hands
the backend the job it was asked for (the job's environment included) and removes the record after, however the phase
ended. The backend here is a stand-in that records what it got; the real ones run in the suites."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from config.loader import load_config
from config.sections.launch import LaunchConfig
from core.errors import EXIT_USER_ERROR, RetryableError, UserError
from launch import phase
from launch.backend import Backend
from launch.job import EVAL, Info, OnProgress, PhaseJob
from launch.liveness import record_url
from pipeline.plan import build_spec
from storage.fs import exists
from storage.location import Location
from storage.spec import DatasetRef, WrittenSpec, publish_spec


def test_every_backend_the_config_allows_is_registered_with_the_whole_interface() -> None:
    allowed = set(typing.get_args(LaunchConfig.model_fields["backend"].annotation))
    registered = phase.backends()
    assert set(registered) == allowed
    for name in allowed:
        backend = phase.backend_for(name)
        assert isinstance(backend.elastic, bool), name
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
        phase.run_phase(spec, EVAL, lambda _: None, model=Location("/m", {"anon": True}), env={"NCCL_DEBUG": "INFO"})
    else:
        with pytest.raises(RetryableError):
            phase.run_phase(
                spec, EVAL, lambda _: None, model=Location("/m", {"anon": True}), env={"NCCL_DEBUG": "INFO"}
            )
    (job,) = backend.jobs
    assert (job.written, job.phase, job.model, dict(job.env)) == (spec, EVAL, Location("/m"), {"NCCL_DEBUG": "INFO"})
    assert job.model is not None and dict(job.model.options) == {"anon": True}  # the location, options and all
    assert backend.beating == [True] and backend.cancelled == [error is not None]
    assert not exists(record_url(spec.spec.run))  # removed once the phase ended: the nodes stop on their own


ELASTIC = ["launch.nnodes=3", "launch.min_nnodes=2", "train.global_batch_size=24"]
REFUSED = (
    "launch.min_nnodes/max_nnodes: only launch.backend=local, ssh or kubernetes picks the surviving nodes so far, not "
    "{backend}; leave them empty (every node must come back)"
)


@pytest.mark.parametrize("backend", ["prefect", "slurm"])
def test_an_elastic_range_on_a_backend_that_needs_every_node_back_is_refused(backend: str) -> None:
    """The config no longer names the backends that can run an elastic range: each backend says (`elastic`)."""
    cfg = load_config(None, [*ELASTIC, f"launch.backend={backend}"])  # the config itself has no objection
    with pytest.raises(UserError) as refused:
        phase.run_backend(cfg)
    assert str(refused.value) == REFUSED.format(backend=backend) and refused.value.exit_code == EXIT_USER_ERROR


@pytest.mark.parametrize("backend", ["local", "kubernetes"])
def test_an_elastic_range_on_an_elastic_backend_is_its_backend(backend: str) -> None:
    settings = [*ELASTIC, f"launch.backend={backend}"]
    if backend == "kubernetes":
        settings += ["run.storage=s3://bucket/t", "launch.kubernetes.image=registry.example/tandem:0.1"]
    cfg = load_config(None, settings)
    assert type(phase.run_backend(cfg)) is type(phase.backend_for(backend))
    fixed = load_config(None, ["launch.backend=slurm", "launch.nnodes=3"])  # no range: every backend runs it
    assert type(phase.run_backend(fixed)) is type(phase.backend_for("slurm"))
