"""The run's choices (trainer/model/choices.py), resolved once for the device before the model loads: on a CPU the
built-in kernels and SDPA with padded micro-batches; a kernel or an attention that cannot run here is one line then;
preference objectives and sequence parallelism never take the variable-length layout by default."""

from __future__ import annotations

import pytest
import torch

from core.errors import UserError
from tests.specs import spec_for
from trainer.model.attention import Attention
from trainer.model.choices import Choices, resolve
from trainer.model.kernels import Kernels
from trainer.parallel.distributed import Dist

CPU = Dist(0, 0, 1, 0, "test", torch.device("cpu"))


def test_a_cpu_run_takes_the_built_in_kernels_and_padded_sdpa(tmp_path) -> None:
    choices = resolve(spec_for(tmp_path, []), CPU)
    assert choices == Choices(Kernels.BUILTIN, Attention.SDPA, bf16=False, zero_stage=2)
    assert not (choices.liger or choices.flat or choices.zero3) and choices.load_attention is None
    zero3 = resolve(spec_for(tmp_path, ["deepspeed.config=config/deepspeed/zero3.json"]), CPU)
    assert zero3.zero3 and zero3.zero_stage == 3


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("train.kernels=liger", "train.kernels=liger cannot run: its Triton kernels need a CUDA device"),
        ("train.attention=flex", "train.attention=flex cannot train on a CPU"),
        ("train.attention=varlen", "train.attention=varlen cannot run: its kernel needs a CUDA device"),
    ],
)
def test_what_cannot_run_here_stops_before_the_model_loads_in_one_line(tmp_path, setting: str, message: str) -> None:
    with pytest.raises(UserError, match=message) as refused:
        resolve(spec_for(tmp_path, [setting]), CPU)
    assert "\n" not in str(refused.value)


def test_the_variable_length_layout_is_what_flattens_micro_batches() -> None:
    assert Choices(Kernels.LIGER, Attention.VARLEN, True, 2).flat
    assert Choices(Kernels.LIGER, Attention.FLASH, True, 2).load_attention == "flash_attention_2"
    assert not Choices(Kernels.BUILTIN, Attention.FLEX, True, 3).flat


def test_a_vision_language_model_takes_padded_micro_batches_and_refuses_what_would_split_its_images(
    tmp_path, qwen25_vl: str
) -> None:
    """Padded sdpa micro-batches, `auto` included; the padding-free layout (flash, varlen: its boundaries would reach
    the vision tower's attention) and sequence parallelism (it would split an image's tokens) refused in one line."""
    assert resolve(spec_for(tmp_path, [], model=qwen25_vl), CPU).attention is Attention.SDPA
    with pytest.raises(UserError, match=r"^train\.attention=varlen with a vision-language model: its padding-free"):
        resolve(spec_for(tmp_path, ["train.attention=varlen"], model=qwen25_vl), CPU)
    split = Dist(0, 0, 2, 0, "test", torch.device("cpu"), local_world=2, sequence_parallel=2)
    ulysses = ["launch.nproc_per_node=2", "train.sequence_parallel_size=2", "train.micro_batch_size=1"]
    with pytest.raises(UserError, match=r"^train\.sequence_parallel_size > 1 with a vision-language model"):
        resolve(spec_for(tmp_path, ulysses, model=qwen25_vl), split)
