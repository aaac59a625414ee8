"""The model an evaluation loads: an export (final/) as users load it, full weights or an adapter on the spec's base,
from local storage or copied from an object store; a directory without COMPLETE, an incomplete checkpoint or one of
another method refused in one line. Checkpoints reassembled from real ZeRO shards:
tests/distributed/test_evaluate.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from core.errors import UserError
from storage.checkpoints import model_manifest
from storage.location import Location, join
from tests.checkpoints import save_checkpoint
from tests.specs import spec_for
from trainer.checkpointing.deepspeed_io import publish_dir
from trainer.evaluation.load import is_checkpoint, load_for_eval

CPU = torch.device("cpu")
IDS = torch.tensor([[5, 17, 42, 99, 3]])


def exported(source: Path, target: Location, staging: Path) -> Location:
    shutil.copytree(source, staging)
    publish_dir(str(staging), target, "blake3", lambda files: model_manifest(4, "blake3", files))
    return target


def test_an_export_loads_as_users_load_it_locally_or_from_an_object_store(tiny_model, tmp_path, s3_bucket) -> None:
    from transformers import AutoModelForCausalLM

    spec = spec_for(tmp_path, []).model_copy(update={"model_path": tiny_model})
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)(IDS).logits
        for target in (Location(str(tmp_path / "final")), join(s3_bucket, "runs/r/final")):
            model = load_for_eval(exported(Path(tiny_model), target, tmp_path / "staging"), spec, CPU)
            assert not model.training and not is_checkpoint(target)
            torch.testing.assert_close(model(IDS).logits, expected)


def test_an_adapter_export_loads_on_the_specs_base(tiny_model, tmp_path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    adapter = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32),
        LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
    )
    for name, parameter in adapter.named_parameters():
        if "lora_B" in name:
            parameter.data.normal_(std=0.05)
    adapter.save_pretrained(tmp_path / "adapter")
    spec = spec_for(tmp_path, []).model_copy(update={"model_path": tiny_model})
    model = load_for_eval(exported(tmp_path / "adapter", Location(str(tmp_path / "final")), tmp_path / "s"), spec, CPU)
    with torch.no_grad():
        torch.testing.assert_close(model(IDS).logits, adapter.eval()(IDS).logits)


def test_what_cannot_be_evaluated_is_one_line(tiny_model, tmp_path) -> None:
    spec = spec_for(tmp_path, ["train.method=full"]).model_copy(update={"model_path": tiny_model})
    unsealed = Path(shutil.copytree(tiny_model, tmp_path / "copied"))
    (unsealed / "COMPLETE").unlink(missing_ok=True)
    with pytest.raises(UserError, match=r"no COMPLETE marker; only complete checkpoints \(checkpoints/step-N\) and"):
        load_for_eval(Location(str(unsealed)), spec, CPU)
    unfinished = save_checkpoint(tmp_path, 4, seal=False)
    (Path(str(unfinished)) / "manifest.json").write_text('{"schema": "tandem.checkpoint/1"}')
    assert is_checkpoint(unfinished)
    with pytest.raises(UserError, match=r"the checkpoint is not complete \(no COMPLETE matching its manifest.json\)"):
        load_for_eval(unfinished, spec, CPU)
    lora = save_checkpoint(tmp_path, 8)  # a LoRA run's checkpoint, for a spec that trains full weights
    with pytest.raises(UserError, match=r"a lora checkpoint, but the spec trains full; evaluate it with the spec"):
        load_for_eval(lora, spec, CPU)
