"""A dry run of a run's launch (launch/dry_run.py) for every backend: each phase as its backend describes it, train
then eval, with the placeholders named in the header; nothing written to storage, no credential value printed. What
each backend's description holds is in tests/unit/launch/backends/; the CLI's `--dry-run` is in tests/test_cli.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from config.loader import load_config
from launch.dry_run import dry_run_text, planned_job
from launch.job import TRAIN

CANARY = "hf_canary_value_123"
BACKENDS = {
    "local": [],
    "prefect": ["launch.backend=prefect"],
    "slurm": ["launch.backend=slurm"],
    "ssh": ["launch.backend=ssh", "launch.hosts=[n0, n1]"],
    "kubernetes": [
        "launch.backend=kubernetes",
        "launch.kubernetes.image=registry.example/tandem:0.1",
        "launch.kubernetes.secret=tandem-creds",
        "launch.kubernetes.pvc=shared",
    ],
}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_backend_describes_train_then_eval_and_nothing_is_written(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", CANARY)
    storage = tmp_path / "storage"
    settings = [f"run.storage={storage}", "launch.forward_env=[HF_TOKEN]", *BACKENDS[backend]]
    if backend == "kubernetes":
        settings.append(f"launch.kubernetes.pvc_path={storage}")
    text = dry_run_text(load_config(None, settings))
    assert text.startswith(f"# Dry run of launch.backend={backend}: nothing was started or written.")
    train, eval_ = text.split("# --- train\n")[1].split("# --- eval\n")
    assert train.startswith(f"# launch.backend={backend}") and eval_.startswith(f"# launch.backend={backend}")
    assert f"{storage}/runs/RUN-ID/spec.json" in train and f"{storage}/runs/RUN-ID/MODEL" in eval_
    # A node process is sent the digest for its preflight (train only); the local backend's threads hold it.
    assert ("SPEC-DIGEST" in train) is (backend != "local") and "SPEC-DIGEST" not in eval_
    assert CANARY not in text
    assert not storage.exists() and list(tmp_path.iterdir()) == []


def test_the_kubernetes_dry_run_is_yaml_every_object_of_train_and_eval() -> None:
    settings = ["run.storage=s3://bucket/t", "run.name=qwen7b", *BACKENDS["kubernetes"]]
    documents = list(yaml.safe_load_all(dry_run_text(load_config(None, settings))))
    assert [d["kind"] for d in documents] == ["Service", "Job", "Service", "Job"]
    assert [d["metadata"]["name"] for d in documents] == ["tandem-qwen7b-train-xxxx"] * 2 + [
        "tandem-qwen7b-eval-xxxx"
    ] * 2


def test_the_planned_job_holds_only_what_a_launcher_reads_before_the_run_exists(tmp_path: Path) -> None:
    """Its spec carries the run's id, directory and config; what staging decides is left unset, not made up."""
    job = planned_job(load_config(None, [f"run.storage={tmp_path}", "run.name=r1"]), TRAIN)
    spec = job.written.spec
    assert (spec.run_id, str(spec.run), str(job.written.url)) == (
        "r1",
        f"{tmp_path}/runs/r1",
        f"{tmp_path}/runs/r1/spec.json",
    )
    for unknown in ("dataset", "total_steps", "deepspeed", "model_path"):
        with pytest.raises(AttributeError):
            getattr(spec, unknown)
