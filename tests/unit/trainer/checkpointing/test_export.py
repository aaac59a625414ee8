"""The merged export of a LoRA run (train.export_merged): base + adapter as plain weights that load with
from_pretrained alone and compute what the base with its adapter computes, with the base's config, generation config
and tokenizer (model.chat_template in it when set)."""

from __future__ import annotations

import torch

from tests.published import tiny_as_published
from trainer.checkpointing.export import merge_adapter, save_tokenizer

TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"


def test_the_merged_export_loads_alone_and_computes_what_the_adapter_does(tiny_model, tmp_path) -> None:
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    base_dir = tiny_as_published(tiny_model, tmp_path / "base")  # with generation_config.json, as Qwen ships it
    torch.manual_seed(0)
    adapter = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]),
    )
    for name, parameter in adapter.named_parameters():
        if "lora_B" in name:
            parameter.data.normal_(std=0.05)  # B starts at zero: make the adapter change something
    adapter.save_pretrained(tmp_path / "adapter")
    out = tmp_path / "merged"
    merge_adapter(str(base_dir), str(tmp_path / "adapter"), str(out), TEMPLATE, torch.float32, 10**9)

    ids = torch.tensor([[5, 17, 42, 99, 3]])
    with torch.no_grad():
        expected = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), tmp_path / "adapter"
        )(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(out)
        torch.testing.assert_close(merged(ids).logits, expected, rtol=1e-5, atol=1e-5)
        plain = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)(ids).logits
    assert not torch.allclose(plain, expected)  # the adapter mattered, or the comparison proves nothing
    assert merged.config.dtype == torch.float32
    assert GenerationConfig.from_pretrained(out).to_dict() == GenerationConfig.from_pretrained(base_dir).to_dict()
    assert AutoTokenizer.from_pretrained(out).chat_template == TEMPLATE


def test_the_tokenizer_keeps_its_own_template_unless_one_is_set(tiny_model, tmp_path) -> None:
    from transformers import AutoTokenizer

    save_tokenizer(tiny_model, str(tmp_path / "own"), None)
    assert (
        AutoTokenizer.from_pretrained(tmp_path / "own").chat_template
        == AutoTokenizer.from_pretrained(tiny_model).chat_template
    )
