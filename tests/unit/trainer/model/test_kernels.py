"""train.kernels resolved for a device (trainer/model/kernels.py): auto takes the built-in path where Liger cannot run
(this
CPU), liger there stops with one line naming train.kernels and the fix, none is always the built-in path; a model
family without a Liger patch is said so and left alone. The patch itself runs on a GPU (tests/gpu/test_kernels.py)."""

from __future__ import annotations

import pytest
import torch

from config.sections.model_train import TrainConfig
from core.errors import EXIT_USER_ERROR, UserError
from trainer.model import kernels, tiny
from trainer.model.kernels import Kernels

CPU = torch.device("cpu")


def test_the_default_is_auto_and_auto_on_a_cpu_is_the_built_in_path() -> None:
    assert TrainConfig().kernels == "auto"
    assert kernels.resolve("auto", CPU) is Kernels.BUILTIN
    assert kernels.resolve("none", CPU) is Kernels.BUILTIN
    assert kernels.resolve("none", torch.device("cuda")) is Kernels.BUILTIN


def test_liger_where_it_cannot_run_is_a_one_line_error_with_the_fix() -> None:
    with pytest.raises(UserError) as raised:
        kernels.resolve("liger", CPU)
    message = str(raised.value)
    assert "\n" not in message and raised.value.exit_code == EXIT_USER_ERROR
    assert message.startswith("train.kernels=liger cannot run: its Triton kernels need a CUDA device")
    assert "set train.kernels to auto" in message


def test_a_bad_setting_is_refused_by_the_config() -> None:
    with pytest.raises(ValueError, match="kernels"):
        TrainConfig.model_validate({"kernels": "triton"})


def test_the_built_in_path_patches_nothing_and_says_so() -> None:
    model = tiny.build_model(64, pad_id=0, eos_id=1)
    before = type(model.model.norm).forward
    assert kernels.patch_model(model, Kernels.BUILTIN) == "built-in (train.kernels)"
    assert "forward" not in vars(model.model.norm) and type(model.model.norm).forward is before
    model.config.model_type = "gemma"
    assert kernels.patch_model(model, Kernels.LIGER).startswith("no Liger model patch for 'gemma' models")
