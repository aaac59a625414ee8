"""trainer/build.py's pieces that need no engine: `seed_everything` gives python, numpy and torch the same streams for
the same seed (every rank's initial weights alike) and other streams for another (the per-rank seeds), with seeds
beyond numpy's 32 bits folded in; the DeepSpeed config a rank builds with (precision and the model's sizes filled in,
each rank under its own tag). The named steps on real engines and ranks are tests/distributed/test_trainer.py's."""

from __future__ import annotations

import random

import numpy as np
import torch

from trainer.build import seed_everything


def draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.random()), torch.rand(3).tolist()


def test_the_same_seed_gives_the_same_streams_and_another_seed_others() -> None:
    seed_everything(1234)
    first = draws()
    seed_everything(1234)
    assert draws() == first
    seed_everything(1235)  # rank 1 of a run seeded 1234 (train.seed + rank)
    other = draws()
    assert all(a != b for a, b in zip(first[:2], other[:2], strict=True)) and first[2] != other[2]


def test_a_seed_beyond_32_bits_seeds_numpy_with_its_low_bits() -> None:
    seed_everything(2**32 + 7)  # numpy alone would refuse it
    wide = draws()
    seed_everything(7)
    narrow = draws()
    assert wide[1] == narrow[1]  # numpy: the seed modulo 2**32
    assert wide[0] != narrow[0]  # python's takes the whole seed


def test_the_deepspeed_config_gets_the_precision_and_the_models_sizes_and_no_tag_check(tmp_path, tiny_model) -> None:
    from tests.specs import spec_for
    from trainer.build import deepspeed_config
    from trainer.model.attention import Attention
    from trainer.model.choices import Choices
    from trainer.model.kernels import Kernels

    spec = spec_for(tmp_path, ["deepspeed.config=config/deepspeed/zero3.json"], tiny_model)
    cpu = Choices(Kernels.BUILTIN, Attention.SDPA, bf16=False, zero_stage=2)
    ds = deepspeed_config(spec, cpu)
    assert ds["checkpoint"]["tag_validation"] == "Ignore"  # every rank saves under its own tag
    assert not ds.get("bf16", {}).get("enabled", False)  # float32 on a CPU
    assert "auto" not in str(ds)  # every "auto" resolved from the runtime and the model's config
    assert ds["zero_optimization"]["reduce_bucket_size"] > 0  # ZeRO-3's sizes from the model's hidden size
