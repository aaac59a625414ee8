"""Building a run on a rank, as named steps, each resolving its choices once into a value the later steps and the
objective receive (torchtitan's TrainSpec, read as a contents page):

    choices     kernels, attention, precision, ZeRO stage       trainer/model/choices.py
    deepspeed   the DeepSpeed config with the runtime's values   config/deepspeed.py
    model       load, pad id, kernels, adapters, tiled MLP       trainer/model/build.py
    parallelize sequence parallelism, a mixture of experts       trainer/parallel/parallelize.py
    compile     the decoder layers, with train.compile           trainer/model/build.py
    engine      optimizer, scheduler, deepspeed.initialize       here

The result, `Built`, is what the step loop and the objective's `start` work with.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from config.deepspeed import ModelShape, resolve_from_runtime
from storage.spec import Spec
from trainer.images import ImageInputs
from trainer.metrics import log_memory
from trainer.model.build import build_model, compile_model
from trainer.model.choices import Choices, resolve
from trainer.model.cuda_build import plain_arch_list
from trainer.model.lean_imports import import_muon_uncompiled_unless_configured
from trainer.model.load import PartitionedLoad, model_config, partitioned_load
from trainer.parallel import sequence_parallel
from trainer.parallel.distributed import Dist
from trainer.parallel.moe import RouterBalance
from trainer.parallel.parallelize import parallelize
from trainer.watch.faults import Faults


@dataclass
class Built:
    """A rank's built run: the DeepSpeed engine (`engine`; DeepSpeed ships no types), the pad id, the choices it was
    built with, a mixture of experts' router balance (None for a dense model), under ZeRO-3 the partitioned load,
    kept alive for the run (trainer/model/load.py), and a vision-language model's image inputs (trainer/images.py;
    None for a causal LM)."""

    engine: Any
    pad_id: int
    choices: Choices
    router: RouterBalance | None
    partitioned: PartitionedLoad | None
    images: ImageInputs | None = None


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_engine(spec: Spec, dist: Dist, faults: Faults) -> Built:
    """The spec's model for its method, laid out for this rank's job, inside a DeepSpeed engine."""
    choices = resolve(spec, dist)  # before the model loads: a kernel or attention that cannot run stops here
    ds = deepspeed_config(spec, choices)
    seed_everything(spec.config.train.seed)  # the same initial weights (LoRA's random A) on every rank
    partitioned = partitioned_load(ds, spec.config.train.method, spec.config.deepspeed.zero3_init)
    model, pad_id = build_model(spec, choices, partitioned=partitioned is not None)
    router = parallelize(model, spec.config.train, dist, choices.zero_stage, faults)
    compile_model(model, spec)
    engine = initialize(model, spec, ds, dist)
    images = ImageInputs.of(
        spec.model_path, model_config(spec.model_path, trust_remote_code=spec.config.model.trust_remote_code)
    )
    return Built(engine, pad_id, choices, router, partitioned, images)


def deepspeed_config(spec: Spec, choices: Choices) -> dict[str, Any]:
    """spec.json's DeepSpeed config with the precision and the model's sizes filled in."""
    if choices.bf16:
        plain_arch_list()
    shape = ModelShape.of(model_config(spec.model_path, trust_remote_code=spec.config.model.trust_remote_code))
    ds = resolve_from_runtime(spec.deepspeed, bf16=choices.bf16, shape=shape)
    # Each rank saves under its own tag (rank-{r}); DeepSpeed's cross-rank tag check would flag that.
    ds.setdefault("checkpoint", {})["tag_validation"] = "Ignore"
    return ds


def initialize(model: torch.nn.Module, spec: Spec, ds: dict[str, Any], dist: Dist) -> Any:
    """The DeepSpeed engine of `model`'s trainable parameters: the optimizer the config names, train.lr_scheduler
    with its warm-up, and sequence parallelism's groups."""
    import deepspeed
    from transformers import get_scheduler

    train = spec.config.train
    warmup = math.ceil(train.warmup_ratio * spec.total_steps)

    def scheduler(optimizer: torch.optim.Optimizer) -> Any:
        return get_scheduler(
            train.lr_scheduler, optimizer, num_warmup_steps=warmup, num_training_steps=spec.total_steps
        )

    params = [p for p in model.parameters() if p.requires_grad]
    import_muon_uncompiled_unless_configured(ds)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=params, config=ds, lr_scheduler=scheduler, mpu=sequence_parallel.groups(dist)
    )
    log_memory("engine built")
    return engine
