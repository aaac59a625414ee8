"""A whole pipeline on an object store: `flows.finetune` with run.storage on a real S3 HTTP endpoint (moto's server)
on 127.0.0.1, the endpoint given in run.storage_options only (no AWS_ENDPOINT_URL anywhere), as docs/data.md's MinIO
recipe does. Staging, spec.json, the nodes and ranks (which get the run's location with its options in their --spec),
the checkpoints written, verified, retained and resumed after a lost rank, the export, the evaluation and the
registration all reach the store through the options the run carries. Real torchrun ranks, real Prefect server."""

from __future__ import annotations

import json
import os

import pytest
from torch.testing import assert_close

from config.loader import load_config
from pipeline.models import registry_name
from storage import layout
from storage.checkpoints import complete_checkpoints
from storage.digest import digest_bytes
from storage.fs import exists, listdir, read_bytes, read_json
from storage.location import Location, join
from storage.manifest import verify_files
from storage.registry import read_entry
from storage.spec import load_spec
from tests.distributed.harness import BASE_OVERRIDES, Run, eval_exported, storage_settings

SETTINGS = ["launch.nnodes=2", "train.keep_latest_k=1"]  # the reference's 12 steps, a checkpoint every 4


@pytest.mark.multirun
def test_a_pipeline_on_s3_with_the_endpoint_in_the_storage_options_only(
    s3_endpoint, prefect_server, tiny_model, reference: Run, tmp_path, monkeypatch
) -> None:
    """The same run as the local reference (tests/distributed/conftest.py), through the pipeline on S3, with rank 1
    dying once at step 6: the train task's retry resumes from step 4 and ends on the reference's trajectory."""
    import s3fs

    from flows.finetune import finetune

    assert not {"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"} & set(os.environ)  # the options are the only way there
    options = {"endpoint_url": s3_endpoint}
    s3fs.S3FileSystem(client_kwargs=options).mkdir("tandem-ckpt")
    root = Location("s3://tandem-ckpt/store", options)
    monkeypatch.setenv("TANDEM_TEST_EXIT_AT_STEP", "1:6")
    monkeypatch.setenv("TANDEM_TEST_EXIT_ONCE", str(tmp_path / "exited-once"))
    cfg = load_config(
        None,
        [
            *storage_settings(root.url, options),
            "run.name=s3-run",
            f"model.name_or_path={tiny_model}",
            *BASE_OVERRIDES,
            *SETTINGS,
            "launch.retries=1",
            "launch.retry_delay_s=0",
        ],
    )
    summary = finetune(cfg)

    run_url = layout.run_dir(cfg.run, "s3-run")
    assert summary["run_url"] == "s3://tandem-ckpt/store/runs/s3-run" and run_url.options == options
    spec, _ = load_spec(join(run_url, layout.SPEC))
    assert json.loads(read_bytes(join(run_url, layout.SPEC)))["run"] == {"url": summary["run_url"], "options": options}
    assert spec.dataset_dir.url.startswith("s3://tandem-ckpt/store/datasets/")  # staged there, through the options
    resumed = Run(spec, join(run_url, layout.SPEC))
    assert_close(resumed.losses(), reference.losses(), rtol=1e-9, atol=1e-9)
    assert "resumed from step 4" in read_bytes(join(layout.node_dir(run_url, 0), layout.LOG)).decode()

    assert listdir(layout.checkpoints_dir(run_url)) == ["step-00000012"]  # keep_latest_k=1
    ckpt = layout.checkpoint_dir(run_url, 12)
    raw = read_bytes(join(ckpt, layout.MANIFEST))
    assert read_bytes(join(ckpt, layout.COMPLETE)).decode().strip() == digest_bytes(raw, "blake3")
    manifest = complete_checkpoints(run_url)[0].manifest
    verify_files(ckpt, manifest, mode="full")  # re-read every shard from S3 and check its digest
    assert {f["rank"] for f in manifest["files"]} == {0, 1}
    final = layout.final_dir(run_url)
    assert exists(join(final, layout.COMPLETE)) and exists(join(final, "adapter_model.safetensors"))
    # the export on S3 evaluates (copied next to the rank) to the loss the trainer measured in memory
    final_eval = next(r for r in resumed.metrics() if r.get("event") == "final_eval")
    assert_close(eval_exported(resumed), final_eval["loss"], rtol=1e-5, atol=1e-5)
    # the evaluation phase and the registration wrote there too
    assert read_json(join(run_url, layout.EVAL))["loss"] == summary["eval"]["loss"]
    assert summary["registered"]
    entry = read_entry(root, registry_name(cfg), 1)
    assert entry["run_url"] == summary["run_url"] and entry["lineage"]["dataset_id"] == summary["dataset_id"]
