"""The objective contract's check of the staged rows (trainer/objectives/base.py `check_rows`): a dataset staged for
another objective stops the trainer at its start in one line naming the fix, for pairs, KTO feedback and supervised
rows, on splits staged for real from the tiny model's tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.objectives import DPO, IPO, KTO, ORPO, SFT, Objective
from config.sections.run_data import DataConfig
from core.errors import UserError
from staging.stage import stage_dataset
from storage.location import Location
from storage.split_reader import Shard, Split
from tests.datafiles import write_jsonl
from trainer.objectives.base import check_rows

Q, C, R = "Is the sky blue?", "Yes, on a clear day.", "No, it is plaid."
PAIR = {
    "messages": [{"role": "user", "content": Q}],
    "chosen": {"role": "assistant", "content": C},
    "rejected": {"role": "assistant", "content": R},
}
FEEDBACK = {"prompt": [{"role": "user", "content": Q}], "completion": [{"role": "assistant", "content": C}]}
SUPERVISED = {"messages": [{"role": "user", "content": Q}, {"role": "assistant", "content": C}]}


def split_of(tmp_path: Path, tokenizer: str, name: str, records: list[dict], preference: str) -> Split:
    """The train split of `records` staged with data.preference=`preference`."""
    source = write_jsonl(tmp_path / f"{name}.jsonl", records)
    data = DataConfig(source=str(source), preference=preference, eval_ratio=0, max_length=256)
    ref = stage_dataset(data, Location(str(tmp_path / name)), tokenizer, bars=False)
    return Split([Shard(Path(ref.url) / "train" / "shard-00000.arrow")], len(records))


def refusal(split: Split, objective: Objective) -> str:
    with pytest.raises(UserError) as info:
        check_rows(split, objective)
    return str(info.value)


def test_rows_staged_for_another_objective_stop_the_trainer_in_one_line(tmp_path: Path, tiny_model: str) -> None:
    pairs = split_of(tmp_path, tiny_model, "pairs", [PAIR, PAIR], "pairs")
    feedback = split_of(
        tmp_path, tiny_model, "kto", [{**FEEDBACK, "label": True}, {**FEEDBACK, "label": False}], "pairs"
    )
    supervised = split_of(tmp_path, tiny_model, "sft", [SUPERVISED], "refuse")
    for objective in (DPO, IPO, ORPO):
        check_rows(pairs, objective)
    check_rows(feedback, KTO)
    check_rows(supervised, SFT)
    assert (
        refusal(pairs, KTO) == "train.objective=kto: the dataset holds pairs; set train.objective to dpo, ipo or orpo"
    )
    assert refusal(feedback, DPO) == (
        "train.objective=dpo: the dataset holds KTO feedback (answers labelled true or false); set "
        "train.objective to kto"
    )
    assert refusal(pairs, SFT) == (
        "train.objective=sft and the staged dataset disagree: it holds preference rows; stage it with "
        "data.preference=refuse or chosen"
    )
    assert refusal(supervised, ORPO) == (
        "train.objective=orpo and the staged dataset disagree: it holds supervised rows; stage it with "
        "data.preference=pairs"
    )
