"""The `model`, `train` and `deepspeed` sections: their bounds as one-line errors naming the key, and the export's shard
size read as Hugging Face reads it."""

from __future__ import annotations

import pytest

from config.loader import load_config
from config.methods import LORA
from config.sections.model_train import TrainConfig, size_in_bytes
from core.errors import UserError


@pytest.mark.parametrize(
    ("size", "expected"),
    [("50GB", 50 * 10**9), ("500MB", 500 * 10**6), ("2GiB", 2 * 2**30), ("1.5 KiB", 1536), ("10B", 10)],
)
def test_shard_sizes_are_decimal_units_and_binary_ones_with_an_i(size: str, expected: int) -> None:
    assert size_in_bytes(size) == expected


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("train.export_shard_size=50 gigabytes", "train.export_shard_size: String should match pattern"),
        ("train.lora.dropout=1.0", "train.lora.dropout: Input should be less than 1"),
        ("train.preempt_grace_s=60", "train.preempt_grace_s: Input should be less than or equal to 30"),
        ("train.straggler_factor=1", "train.straggler_factor: Input should be greater than 1"),
        ("train.preference.label_smoothing=0.5", "train.preference.label_smoothing: Input should be less than 0.5"),
        ("train.log_steps=0", "train.log_steps: Input should be greater than 0"),
        ("train.lora.target_modules=[]", "train.lora.target_modules: List should have at least 1 item"),
    ],
)
def test_a_value_out_of_bounds_is_one_line_naming_its_key(override: str, expected: str) -> None:
    with pytest.raises(UserError) as info:
        load_config(None, [override])
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_the_defaults_mirror_qwens_lora_script() -> None:
    train = TrainConfig()
    assert (train.method, train.learning_rate, train.micro_batch_size, train.gradient_accumulation_steps) == (
        LORA,
        3e-4,
        2,
        8,
    )
    assert (train.lora.r, train.lora.alpha, train.adam_beta2, train.weight_decay) == (8, 16, 0.95, 0.1)
