"""The base model's load: the pad id a micro-batch is padded with, from config.json or else the tokenizer; a directory
that ships its own code only with model.trust_remote_code; ZeRO-3's partitioned load only where it applies."""

from __future__ import annotations

import json
import shutil

import pytest

from config.methods import FULL, LORA, QLORA
from core.errors import UserError
from tests.published import tiny_as_published
from trainer.model.load import ensure_pad_token_id, load_base, model_config, partitioned_load


def test_the_pad_id_comes_from_config_json_else_the_tokenizer(tiny_model, tmp_path) -> None:
    published = tiny_as_published(tiny_model, tmp_path / "published")  # Qwen ships no pad_token_id
    model = load_base(str(published), method=LORA, bf16=False)
    assert model.config.pad_token_id is None
    from transformers import AutoTokenizer

    pad = AutoTokenizer.from_pretrained(published).pad_token_id
    assert ensure_pad_token_id(model, str(published)) == pad and model.config.pad_token_id == pad
    with pytest.raises(UserError, match=rf"^model.name_or_path {tmp_path}/none: cannot load"):
        load_base(str(tmp_path / "none"), method=FULL, bf16=False)


def test_a_directory_that_ships_its_own_code_loads_only_with_model_trust_remote_code(tmp_path) -> None:
    """A remote-code model's config.json and code files (tests/fixtures/per_expert_moe, no weights needed to read the
    config): refused in one line naming the setting without trust_remote_code, read with it."""
    from tests.published import PER_EXPERT_CODE, PER_EXPERT_MOE

    for code in PER_EXPERT_CODE.glob("*_per_expert_moe.py"):
        shutil.copy(code, tmp_path / code.name)
    (tmp_path / "config.json").write_text(json.dumps(PER_EXPERT_MOE))
    refusal = rf"^model.name_or_path {tmp_path}: its config.json's auto_map names code .* model.trust_remote_code: true"
    with pytest.raises(UserError, match=refusal):
        model_config(str(tmp_path))
    with pytest.raises(UserError, match=refusal):
        load_base(str(tmp_path), method=LORA, bf16=False)
    assert model_config(str(tmp_path), trust_remote_code=True)["model_type"] == "per_expert_moe"


def test_the_partitioned_load_is_for_zero3_full_and_lora_only() -> None:
    zero2, zero3 = {"zero_optimization": {"stage": 2}}, {"zero_optimization": {"stage": 3}}
    assert partitioned_load(zero2, LORA) is None
    assert partitioned_load(zero3, QLORA) is None  # bitsandbytes' 4-bit weights are not partitioned
    assert partitioned_load(zero3, FULL, enabled=False) is None  # deepspeed.zero3_init: false
