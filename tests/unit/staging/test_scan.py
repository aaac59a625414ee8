"""Pass one: every record read is spooled with its split or kept out with its reason, every source counted, the eval
split held out by digest and capped; an empty result, or an empty split the settings ask for, is one line."""

from __future__ import annotations

import pytest

from config.sections.run_data import DataConfig
from core.errors import UserError
from staging.identity import survey
from staging.progress import Reporter
from staging.scan import EVAL, TRAIN, check_splits, scan_sources
from staging.spool import read_chunk
from tests.datafiles import arithmetic, write_jsonl

FINGERPRINT = {"files": {"tokenizer.json": "abc"}}


def scan(data: DataConfig, tmp_path, lines: list[str] | None = None):
    reporter = Reporter(lines.append if lines is not None else lambda _: None, bars=False)
    return scan_sources(survey(data, FINGERPRINT, reporter), data, tmp_path / "spool", reporter)


def test_every_record_is_spooled_with_its_split_or_kept_out_with_its_reason(tmp_path) -> None:
    records = arithmetic(60)
    records[5] = {"conversations": [{"from": "user", "value": "no answer"}]}
    source = write_jsonl(tmp_path / "a.jsonl", records)
    lines: list[str] = []
    result = scan(DataConfig(source=source, eval_ratio=0.2, on_invalid="skip"), tmp_path, lines)
    assert result.spooled == 59 and [(r.location, r.reason) for r in result.rejects] == [
        (f"{source}:6", "no assistant turn")
    ]
    assert set(result.splits) == {EVAL, TRAIN} and 0 < sum(result.splits) < 59
    spooled = [item for chunk in result.chunks for item in read_chunk(tmp_path / "spool", chunk)]
    assert [location for location, _ in spooled] == [f"{source}:{n}" for n in range(1, 61) if n != 6]
    [row] = result.sources
    assert (row["records"], row["rejected"], row["format"]) == (59, 1, "qwen")
    again = scan(DataConfig(source=source, eval_ratio=0.2, on_invalid="skip"), tmp_path)
    assert (again.splits, again.records_digest) == (result.splits, result.records_digest)  # deterministic


def test_the_eval_split_is_capped_and_the_rest_trains(tmp_path) -> None:
    source = write_jsonl(tmp_path / "a.jsonl", arithmetic(200))
    uncapped = scan(DataConfig(source=source, eval_ratio=0.5, eval_max_records=None), tmp_path)
    capped = scan(DataConfig(source=source, eval_ratio=0.5, eval_max_records=10), tmp_path)
    assert sum(capped.splits) == 10 and capped.eval_capped == sum(uncapped.splits) - 10
    assert all(uncapped.splits[i] == EVAL for i, split in enumerate(capped.splits) if split == EVAL)


def test_an_empty_result_or_split_is_one_line(tmp_path) -> None:
    source = write_jsonl(tmp_path / "a.jsonl", [{"conversations": [{"from": "user", "value": "x"}]}] * 2)
    data = DataConfig(source=source, on_invalid="skip")
    with pytest.raises(UserError, match=rf"no usable records \(2 rejected; the first: {source}:1: no assistant turn\)"):
        check_splits(scan(data, tmp_path), data)
    two = DataConfig(source=write_jsonl(tmp_path / "b.jsonl", arithmetic(2)), eval_ratio=0.01)
    with pytest.raises(UserError, match=r"the eval split is empty: no record fell into eval with data.eval_ratio=0.01"):
        check_splits(scan(two, tmp_path), two)
    check_splits(scan(two.model_copy(update={"eval_ratio": 0.0}), tmp_path), two.model_copy(update={"eval_ratio": 0.0}))
    with pytest.raises(UserError, match=r"the train split is empty \(all 2 records fell into eval\)"):
        check_splits(scan(two.model_copy(update={"eval_ratio": 1.0}), tmp_path), two)
