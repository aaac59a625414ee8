"""storage/spec.py: the run's location travels typed in spec.json ({url, options}), and a spec.json written before it
(`run_url`, the options in its config) still loads (no processes)."""

from __future__ import annotations

import json
from pathlib import Path

from config.loader import load_config
from pipeline.plan import build_spec
from storage import layout
from storage.fs import read_bytes
from storage.location import Location, join
from storage.spec import DatasetRef, load_spec, write_spec

ROOT = Path(__file__).resolve().parents[3]
COMPAT_SPEC = ROOT / "tests" / "fixtures" / "compat-run" / "runs" / "compat" / "spec.json"


def test_the_run_location_is_written_with_its_options_and_read_back_typed(tmp_path) -> None:
    options = {"endpoint_url": "http://127.0.0.1:9"}
    cfg = load_config(None, [f"run.storage={tmp_path}", f"run.storage_options={json.dumps(options)}"])
    dataset = DatasetRef(dataset_id="ds-1", url=f"{tmp_path}/datasets/ds-1", manifest_digest="x")
    spec = build_spec(cfg, "r1", str(tmp_path), dataset.model_copy(update={"split_records": {"train": 10}}))
    assert spec.run == layout.run_dir(cfg.run, "r1") and spec.run.options == options
    write_spec(spec)
    url = join(Location(str(tmp_path)), "runs", "r1", layout.SPEC)  # a plain path: no options needed to read it
    doc = json.loads(read_bytes(url))
    assert doc["run"] == {"url": f"{tmp_path}/runs/r1", "options": options} and "run_url" not in doc
    again, _ = load_spec(url)
    assert again.run.url == f"{tmp_path}/runs/r1" and again.run.options == options
    assert again.dataset_dir == Location(f"{tmp_path}/datasets/ds-1") and again.dataset_dir.options == options


def test_a_spec_written_before_the_typed_location_reads_its_run_url_with_the_configs_options(tmp_path) -> None:
    doc = json.loads(COMPAT_SPEC.read_text().replace("@STORAGE@", str(tmp_path)).replace("@REPO@", str(ROOT)))
    assert "run_url" in doc and "run" not in doc  # the form an older version wrote
    doc["config"]["run"]["storage_options"] = {"endpoint_url": "http://127.0.0.1:9"}
    path = tmp_path / "runs" / "compat" / "spec.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc))
    spec, _ = load_spec(Location(str(path)))
    assert spec.run.url == f"{tmp_path}/runs/compat"
    assert spec.run.options == {"endpoint_url": "http://127.0.0.1:9"}
    assert spec.dataset_dir.url == doc["dataset"]["url"] and spec.dataset_dir.options == spec.run.options
