"""Checkpoints on an object store: the trainer writes, verifies, retains, resumes and exports through s3fs
against a real S3 HTTP endpoint (moto's server) on 127.0.0.1, with real torchrun ranks."""

from __future__ import annotations

import pytest
from torch.testing import assert_close

from core.errors import RetryableError
from storage import layout
from storage.checkpoints import complete_checkpoints
from storage.digest import digest_bytes
from storage.fs import exists, join, listdir, read_bytes
from storage.manifest import verify_files
from tests.distributed.harness import Run, Staged, eval_exported, stage, train

SETTINGS = ["launch.nnodes=2", "train.keep_latest_k=1"]  # the reference's 12 steps, a checkpoint every 4


@pytest.fixture(scope="module")
def s3_staged(s3_endpoint) -> Staged:
    import s3fs

    s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint}).mkdir("tandem-ckpt")
    return stage("s3://tandem-ckpt/store", options={"endpoint_url": s3_endpoint})


@pytest.mark.multirun
def test_checkpoints_on_s3_are_whole_resumable_and_retained(s3_staged: Staged, reference: Run) -> None:
    """The same run as the local reference (tests/distributed/conftest.py), on S3, with rank 1 dying at step 6."""
    with pytest.raises(RetryableError, match="rank 1 exited with code 137"):
        train(s3_staged, "s3-run", SETTINGS, env={"TANDEM_TEST_EXIT_AT_STEP": "1:6"})
    run_url = layout.run_dir(s3_staged.root, "s3-run")
    assert [c.step for c in complete_checkpoints(run_url)] == [4]

    resumed = train(s3_staged, "s3-run", SETTINGS)
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
