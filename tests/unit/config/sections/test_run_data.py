"""The `run` and `data` sections: a run's name and storage, the data's sources and mappings, and the checks between
their fields, each a one-line error naming the key."""

from __future__ import annotations

import pytest

from config.loader import load_config
from config.sections.run_data import CATALOG_ENTRY, COLUMN_NAMES, DataConfig, check_mapping
from core.errors import UserError


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["run.name=-starts-with-a-dash"], "run.name: String should match pattern"),
        (["data.preference=pairs", "data.packing=true"], "data.packing: preference data is not packed"),
        (
            ["data.shard_rows=10000000", "data.max_length=4096"],
            "data.shard_rows x data.max_length must stay below 2^31 tokens per shard, got 10000000 x 4096; lower "
            "data.shard_rows or data.max_length",
        ),
        (
            ["data.sources=[{source: a.jsonl, columns: {prompt: q}}]"],
            "data.sources[].columns/tags rename the keys of one format: set data.sources[].format",
        ),
        (
            ["data.columns={videos: clips}", "data.format=sharegpt"],
            "unknown name 'videos'; the names are LLaMA-Factory",
        ),
        (["data.num_proc=300"], "data.num_proc: Input should be less than or equal to 256"),
        (["data.excess_length=cut"], "data.excess_length: Input should be 'truncate', 'drop' or 'fail'"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_key(overrides: list[str], expected: str) -> None:
    with pytest.raises(UserError) as info:
        load_config(None, overrides)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_a_catalog_reference_is_a_json_path_and_an_entry_name() -> None:
    match = CATALOG_ENTRY.match("/data/lf/dataset_info.json#alpaca_en_demo")
    assert match and (match["path"], match["name"]) == ("/data/lf/dataset_info.json", "alpaca_en_demo")
    assert CATALOG_ENTRY.match("data.json") is None and CATALOG_ENTRY.match("a.jsonl#x") is None
    assert CATALOG_ENTRY.match("info.json#a/b") is None  # an entry name has no slash


def test_mappings_take_llama_factorys_names_only() -> None:
    assert check_mapping({"prompt": "question", "response": "answer"}, COLUMN_NAMES) == {
        "prompt": "question",
        "response": "answer",
    }
    with pytest.raises(ValueError, match=r"^data.columns: unknown name 'answer'; the names are LLaMA-Factory's"):
        check_mapping({"answer": "x"}, COLUMN_NAMES, "data.columns")
    data = DataConfig(format="alpaca", columns={"prompt": "question"}, eval_source="held-out.jsonl")
    assert (data.columns, data.eval_source, data.mix, data.packing) == (
        {"prompt": "question"},
        "held-out.jsonl",
        "concat",
        None,
    )
