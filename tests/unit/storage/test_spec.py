"""spec.json: written once, read back and validated again by every node and rank, its sha256 the one the lineage
records; a missing, foreign or edited file refused in one line; the run's location travels typed ({url, options}), and a
spec.json written before it (`run_url`, the options in its config) still loads."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from config.loader import load_config
from core.errors import UserError
from pipeline.plan import build_spec
from storage import layout
from storage.fs import read_bytes
from storage.location import Location, join
from storage.spec import Attempt, DatasetRef, load_spec, publish_spec, write_spec
from tests.specs import spec_for

ROOT = Path(__file__).resolve().parents[3]
COMPAT_SPEC = ROOT / "tests" / "fixtures" / "compat-run" / "runs" / "compat" / "spec.json"


def test_the_spec_round_trips_and_its_digest_is_of_the_bytes_written(tmp_path) -> None:
    spec = spec_for(tmp_path, ["run.storage_options={endpoint_url: 'http://127.0.0.1:9000'}"])
    written = publish_spec(spec)
    path = tmp_path / "runs" / "r" / "spec.json"
    assert str(written.url) == str(path) and written.digest == hashlib.sha256(path.read_bytes()).hexdigest()
    again, digest = load_spec(written.url)
    assert again.model_dump(mode="json") == spec.model_dump(mode="json") and digest == written.digest
    assert json.loads(path.read_text())["schema"] == "tandem.spec/1"
    # The split counts staging made stay out of the file: read back, they come from the manifest.
    assert spec.dataset.records("train") == 100 and again.dataset.records("train") is None
    # The run's storage options reach the run and the dataset wherever they are read from.
    assert again.run.options == again.dataset_dir.options == {"endpoint_url": "http://127.0.0.1:9000"}


def test_a_missing_foreign_or_edited_spec_is_one_line(tmp_path) -> None:
    written = publish_spec(spec_for(tmp_path, []))
    missing = Location(str(tmp_path / "nowhere" / "spec.json"))
    with pytest.raises(UserError, match=rf"^--spec {missing}: no such file; pass the spec.json of a run$"):
        load_spec(missing)
    path = tmp_path / "runs" / "r" / "spec.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "world_size": 0}))
    with pytest.raises(UserError, match=r"not a valid tandem.spec/1 document \(1 errors, first: \('world_size',\)"):
        load_spec(written.url)
    path.write_text(json.dumps({**doc, "schema": "tandem.spec/0"}))
    with pytest.raises(UserError, match=r"schema 'tandem.spec/0' is not 'tandem.spec/1'"):
        load_spec(written.url)


def test_an_attempt_describes_its_nodes_and_who_was_left_out() -> None:
    attempt = Attempt(number=2, nodes=[0, 2], world_size=4, from_step=40, left_out={"1": "no answer"})
    assert attempt.describe() == "attempt 2: nodes 0,2 (4 ranks) from step 40; node 1 left out: no answer"


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
