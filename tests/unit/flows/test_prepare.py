"""`python -m flows.prepare`'s own parts: its flags as config overrides (JSON-quoted, so that a path is never read as
YAML) and the summary of a staged dataset from its manifest."""

from __future__ import annotations

import argparse

from config.loader import load_config
from config.sections.run_data import DataConfig
from flows.prepare import overrides, summary_rows
from staging.stage import stage_dataset
from storage.location import Location
from tests.datafiles import arithmetic, write_jsonl


def test_flags_are_overrides_after_the_sets_and_a_path_stays_a_string(tmp_path) -> None:
    odd = tmp_path / "data: v2 #1.jsonl"  # as YAML: a mapping and a comment
    args = argparse.Namespace(overrides=["train.max_steps=3"], data=str(odd), format="qwen", storage=None)
    assert overrides(args) == ["train.max_steps=3", f'data.source="{odd}"', 'data.format="qwen"']
    odd.write_text("")
    assert load_config(None, overrides(args)).data.source == str(odd)


def test_the_summary_counts_come_from_the_manifest(tmp_path, tiny_model) -> None:
    records = arithmetic(40)
    records[3] = {"conversations": [{"from": "user", "value": "no answer"}]}
    source = write_jsonl(tmp_path / "a.jsonl", records)
    data = DataConfig(source=source, eval_ratio=0.25, on_invalid="skip", max_length=64)
    dataset = stage_dataset(data, Location(str(tmp_path / "storage")), tiny_model, bars=False)
    rows = dict(summary_rows(dataset, Location(str(tmp_path / "storage"))))
    assert rows["dataset"].startswith(dataset.dataset_id)
    train, evals = (int(rows[split].split(" records")[0]) for split in ("train", "eval"))
    assert train + evals == 39 and evals > 0
    rejects = f"{tmp_path}/storage/datasets/{dataset.dataset_id}/rejects.jsonl"
    assert rows["records"] == f"40 read, 39 staged, 1 rejected, 0 dropped (see {rejects})"
