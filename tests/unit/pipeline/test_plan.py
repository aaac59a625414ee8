"""Planning a run (pipeline/plan.py): its id (run.name, else a fresh time-stamped one); its total steps
(train.max_steps, else train.epochs over the train rows, per global batch, at least one); and its spec: the run
directory is the one of storage/layout.py `run_dir`, reached with run.storage_options (on a real S3 endpoint, where a
dataset reference without counts is read back from its manifest through those options), DeepSpeed's "auto" values
resolved from train and from the model's config.json, the chat template's text, and the base model's recorded
digest."""

from __future__ import annotations

import json
import re
from pathlib import Path

from config.chat_template import builtin_template
from config.loader import load_config
from config.sections.model_train import TrainConfig
from core.checkout import code_version
from pipeline.plan import build_spec, new_run_id, record_model, total_steps
from storage import layout
from storage.base_model import read_base_model
from storage.fs import write_json_atomic
from storage.location import Location, join
from storage.spec import DatasetRef

SHAPE = {"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128}


def test_a_named_run_keeps_its_name_and_an_unnamed_one_gets_a_fresh_id() -> None:
    assert new_run_id(load_config(None, ["run.name=again"])) == "again"
    cfg = load_config(None, [])
    ids = {new_run_id(cfg) for _ in range(3)}
    assert len(ids) == 3 and all(re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", i) for i in ids)


def test_total_steps_come_from_max_steps_or_epochs_over_the_rows() -> None:
    assert total_steps(TrainConfig(max_steps=7, epochs=5), 1000, 4) == 7
    per_rank = TrainConfig(epochs=2, micro_batch_size=2, gradient_accumulation_steps=3)
    assert [total_steps(per_rank, 100, w) for w in (1, 2)] == [34, 17]  # 200 rows in 6, then 12 a step, rounded up
    fixed = TrainConfig(epochs=2, micro_batch_size=2, global_batch_size=24)
    assert {total_steps(fixed, 100, w) for w in (1, 2, 3, 4)} == {9}  # 200 / 24: the world size does not matter
    assert total_steps(TrainConfig(epochs=0.5, global_batch_size=24), 96, 2) == 2
    assert total_steps(TrainConfig(epochs=1, global_batch_size=24), 3, 2) == 1  # fewer rows than a batch: one step


def test_a_spec_resolves_the_config_once_for_every_rank(tmp_path: Path) -> None:
    cfg = load_config(
        None,
        [
            f"run.storage={tmp_path}",
            "train.max_steps=",
            "train.epochs=3",
            "train.micro_batch_size=2",
            "train.gradient_accumulation_steps=5",
            "model.chat_template=qwen2.5",
        ],
    )
    dataset = DatasetRef(dataset_id="d", url=f"{tmp_path}/datasets/d", manifest_digest="m", split_records={"train": 55})
    spec = build_spec(cfg, "r", str(tmp_path), dataset, model_manifest_digest="base-digest")
    assert spec.run == layout.run_dir(cfg.run, "r") and spec.run.url == f"{tmp_path}/runs/r"
    assert (spec.run_id, spec.world_size, spec.total_steps) == ("r", 2, 9)  # 3 x 55 rows / (2 x 5 x 2 ranks)
    assert (spec.deepspeed["train_micro_batch_size_per_gpu"], spec.deepspeed["gradient_accumulation_steps"]) == (2, 5)
    assert spec.deepspeed["train_batch_size"] == 20
    assert spec.deepspeed["optimizer"]["params"]["lr"] == cfg.train.learning_rate
    assert spec.chat_template == builtin_template("qwen2.5") and spec.code_version == code_version()
    assert (spec.dataset, spec.model_manifest_digest, spec.config) == (dataset, "base-digest", cfg)
    assert build_spec(load_config(None, [f"run.storage={tmp_path}"]), "r", str(tmp_path), dataset).chat_template is None


def test_the_models_shape_resolves_zero3s_sizes_and_its_record_is_under_the_run(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    cfg = load_config(None, [f"run.storage={tmp_path}", "deepspeed.config=config/deepspeed/zero3.json"])
    dataset = DatasetRef(dataset_id="d", url=f"{tmp_path}/datasets/d", manifest_digest="m", split_records={"train": 9})
    unknown = build_spec(cfg, "r", str(model), dataset).deepspeed["zero_optimization"]
    assert unknown["reduce_bucket_size"] == "auto"  # no config.json: the ranks resolve it from the loaded model
    (model / "config.json").write_text(json.dumps(SHAPE))
    digest = record_model(cfg, "r", str(model))
    assert read_base_model(layout.run_dir(cfg.run, "r"), digest)["files"][0]["path"] == "config.json"
    zero = build_spec(cfg, "r", str(model), dataset, digest).deepspeed["zero_optimization"]
    assert (zero["reduce_bucket_size"], zero["stage3_prefetch_bucket_size"]) == (64 * 64, int(0.9 * 64 * 64))
    assert zero["stage3_param_persistence_threshold"] == 640


def test_a_run_on_s3_is_reached_with_run_storage_options(s3_bucket: Location, tmp_path: Path) -> None:
    """A reference read back from spec.json has no counts: the train rows come from the staged manifest, which is
    only reachable through the endpoint in run.storage_options."""
    endpoint = s3_bucket.options["endpoint_url"]
    cfg = load_config(
        None,
        [f"run.storage={s3_bucket.url}/t", f"run.storage_options={{endpoint_url: {endpoint}}}", "train.max_steps="],
    )
    staged = join(layout.root(cfg.run), "datasets", "d")
    splits = {"train": {"records": 200, "rows": 48}, "eval": {"records": 4}}
    manifest = {"schema": layout.DATASET_SCHEMA, "digest_algorithm": "sha256", "splits": splits}
    write_json_atomic(join(staged, layout.MANIFEST), manifest)
    dataset = DatasetRef(dataset_id="d", url=staged.url, manifest_digest="m")
    spec = build_spec(cfg, "r", str(tmp_path), dataset)
    assert spec.run == layout.run_dir(cfg.run, "r") and spec.run.url == f"{s3_bucket.url}/t/runs/r"
    assert spec.run.options == {"endpoint_url": endpoint} and spec.dataset_dir.options == spec.run.options
    assert spec.total_steps == 3  # 48 packed rows (not the 200 records) / 16 a step (4 x 2 x 2 ranks)
