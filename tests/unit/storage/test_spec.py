"""spec.json: written once, read back and validated again by every node and rank, its sha256 the one the lineage
records; a missing, foreign or edited file refused in one line."""

from __future__ import annotations

import hashlib
import json

import pytest

from core.errors import UserError
from storage.fs import Location
from storage.spec import Attempt, load_spec, publish_spec
from tests.specs import spec_for


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
