"""What names a staged dataset: the source key over the files' digests and the settings that shape the bytes (not
where they are read from, nor how fast), the dataset id over the records staged, and each record's split by its
digest."""

from __future__ import annotations

import hashlib

from config.sections.run_data import DataConfig
from staging.identity import dataset_id, eval_key, in_eval, survey
from staging.progress import Reporter
from tests.datafiles import arithmetic, write_jsonl

QUIET = Reporter(lambda _: None, bars=False)
FINGERPRINT = {"files": {"tokenizer.json": "abc"}}


def test_the_source_key_follows_the_bytes_and_the_shaping_settings_only(tmp_path) -> None:
    source = write_jsonl(tmp_path / "a.jsonl", arithmetic(5))
    data = DataConfig(source=source)
    first = survey(data, FINGERPRINT, QUIET)
    assert [(f.key, f.size) for f in first.files] == [("data.source", (tmp_path / "a.jsonl").stat().st_size)]
    assert survey(data.model_copy(update={"num_proc": 4}), FINGERPRINT, QUIET).source_key == first.source_key
    assert survey(data.model_copy(update={"max_length": 64}), FINGERPRINT, QUIET).source_key != first.source_key
    assert survey(data, {"files": {"tokenizer.json": "abd"}}, QUIET).source_key != first.source_key
    write_jsonl(tmp_path / "a.jsonl", arithmetic(5, start=1))  # other bytes at the same place
    assert survey(data, FINGERPRINT, QUIET).source_key != first.source_key


def test_the_dataset_id_follows_the_records_and_what_shapes_them() -> None:
    data = DataConfig()
    ids = {
        dataset_id("r1", None, FINGERPRINT, data, False),
        dataset_id("r2", None, FINGERPRINT, data, False),
        dataset_id("r1", "rejects", FINGERPRINT, data, False),
        dataset_id("r1", None, FINGERPRINT, data, True),
        dataset_id("r1", None, FINGERPRINT, data.model_copy(update={"excess_length": "drop"}), False),
    }
    assert len(ids) == 5 and all(i.startswith("ds-") and len(i) == 19 for i in ids)
    assert dataset_id("r1", None, FINGERPRINT, data.model_copy(update={"on_invalid": "skip"}), False) in ids


def test_a_records_split_is_decided_by_its_digest_alone() -> None:
    digests = [hashlib.sha256(str(i).encode()).digest() for i in range(2000)]
    held = [d for d in digests if in_eval(d, 0.1)]
    assert 150 < len(held) < 250  # about a tenth
    assert all(eval_key(d) < 0.1 * 2**32 for d in held)
    assert [d for d in digests if in_eval(d, 0.1)] == held and not any(in_eval(d, 0.0) for d in digests)
