"""Pass one: every record read is spooled with its split or kept out with its reason, every source counted, the eval
split held out by digest and capped; an empty result, or an empty split the settings ask for, is one line."""

from __future__ import annotations

import math

import blake3
import orjson
import pytest

from config.sections.run_data import DataConfig
from core.errors import UserError
from staging.identity import eval_key, survey
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
    one = DataConfig(source=write_jsonl(tmp_path / "one.jsonl", arithmetic(1)), eval_ratio=0.01)
    with pytest.raises(UserError, match=r"the eval split is empty: no record fell into eval with data.eval_ratio=0.01"):
        check_splits(scan(one, tmp_path), one)
    two = DataConfig(source=write_jsonl(tmp_path / "b.jsonl", arithmetic(2)), eval_ratio=0.01)
    check_splits(scan(two.model_copy(update={"eval_ratio": 0.0}), tmp_path), two.model_copy(update={"eval_ratio": 0.0}))
    with pytest.raises(UserError, match=r"the train split is empty \(all 2 records fell into eval\)"):
        check_splits(scan(two.model_copy(update={"eval_ratio": 1.0}), tmp_path), two)


def keys_of(result, spool) -> list[int]:
    """Each spooled record's eval_key, from its canonical form as staging digests it."""
    bodies = [body for chunk in result.chunks for _, body in read_chunk(spool, chunk)]
    return [eval_key(blake3.blake3(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).digest()) for body in bodies]


@pytest.mark.parametrize("records", [2, 3, 5, 10, 11, 30, 57, 200])
@pytest.mark.parametrize("ratio", [0.01, 0.1, 0.25])
def test_the_eval_split_is_the_lowest_keys_at_least_one_at_most_the_ratio_rounded_up(tmp_path, records, ratio):
    data = DataConfig(source=write_jsonl(tmp_path / "a.jsonl", arithmetic(records)), eval_ratio=ratio)
    lines: list[str] = []
    result = scan(data, tmp_path, lines)
    keys = keys_of(result, tmp_path / "spool")
    below = sum(key / 0x1_0000_0000 < ratio for key in keys)  # what the digests alone hold out
    count = min(max(below, 1), math.ceil(round(ratio * records, 9)))
    lowest = sorted(sorted(range(records), key=lambda i: (keys[i], i))[:count])
    assert [i for i, split in enumerate(result.splits) if split == EVAL] == lowest
    check_splits(result, data)
    assert scan(data, tmp_path).splits == result.splits and result.eval_capped == 0
    said = " ".join(lines)
    assert ("the one nearest to it is held out" in said) == (below == 0)
    assert (f"held to data.eval_ratio={ratio} of {records} records rounded up ({count})" in said) == (below > count)


def test_ten_records_stage_with_the_defaults(tmp_path) -> None:
    data = DataConfig(source=write_jsonl(tmp_path / "a.jsonl", arithmetic(10)))
    result = scan(data, tmp_path)
    check_splits(result, data)
    assert (sum(result.splits), result.spooled) == (1, 10)
