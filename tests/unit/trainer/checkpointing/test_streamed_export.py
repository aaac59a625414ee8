"""The streamed exports against transformers' and PEFT's own: shards and index as save_pretrained writes them (tied
weights once), and a LoRA adapter merged one base shard at a time equal to PEFT's merge_and_unload. The ZeRO-3
gathering itself runs under real ranks in tests/distributed/test_trainer.py (the full ZeRO-3 export of a model with
tied embeddings, evaluated against the in-memory model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from core.errors import UserError
from tests.published import tiny_as_published
from trainer.checkpointing.streamed_export import INDEX, ShardWriter, merge_streamed, persistent_tensors


@pytest.fixture(scope="module")
def sharded(tiny_model: str, tmp_path_factory) -> Path:
    return tiny_as_published(tiny_model, tmp_path_factory.mktemp("published") / "tiny", max_shard_size="200KB")


def test_shards_and_index_load_with_from_pretrained_and_tie_once(sharded: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(sharded, dtype=torch.float32)
    writer = ShardWriter(str(tmp_path), shard_bytes=200_000)
    for name, tensor in persistent_tensors(model):
        writer.add(name, tensor.detach().clone())
    files = writer.close()
    index = json.loads((tmp_path / INDEX).read_text())
    assert len(files) > 2 and files[-1] == INDEX and "lm_head.weight" not in index["weight_map"]
    model.config.save_pretrained(tmp_path)
    back = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    for (name, mine), (_, theirs) in zip(model.state_dict().items(), back.state_dict().items(), strict=True):
        assert torch.equal(mine, theirs), name
    assert back.lm_head.weight.data_ptr() == back.model.embed_tokens.weight.data_ptr()  # still tied


def test_the_streamed_merge_equals_peft_merge_and_unload(sharded: Path, tmp_path: Path) -> None:
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(sharded, dtype=torch.float32)
    torch.manual_seed(0)
    adapter = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]))
    for name, parameter in adapter.named_parameters():
        if "lora_B" in name:
            parameter.data.normal_(std=0.02)  # B starts at zero: make the adapter do something
    adapter.save_pretrained(tmp_path / "adapter")
    expected = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(sharded, dtype=torch.float32), tmp_path / "adapter"
    ).merge_and_unload()
    out = tmp_path / "merged"
    out.mkdir()
    merge_streamed(str(sharded), str(tmp_path / "adapter"), str(out), torch.float32, 200_000, tied=True)
    (out / "config.json").write_text((sharded / "config.json").read_text())
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    for name, tensor in expected.state_dict().items():
        torch.testing.assert_close(merged.state_dict()[name], tensor, rtol=1e-6, atol=1e-7, msg=name)


def test_merging_an_adapter_on_a_tied_output_layer_is_refused(sharded: Path, tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(sharded, dtype=torch.float32)
    get_peft_model(base, LoraConfig(r=2, target_modules=["lm_head"])).save_pretrained(tmp_path / "adapter")
    with pytest.raises(
        UserError, match=r"^train.export_merged: the adapter trains lm_head, whose weight the model ties"
    ):
        merge_streamed(str(sharded), str(tmp_path / "adapter"), str(tmp_path), torch.float32, 200_000, tied=True)
