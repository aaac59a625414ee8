"""Sequence parallelism on a rank (train.sequence_parallel_size > 1): DeepSpeed's Ulysses around the model's attention,
and each micro-batch cut into this rank's part of the sequence.

The layout (which ranks split one sequence, which read different rows) is config/sequence_parallel.py's; `start`
checks that DeepSpeed's groups are that layout and says it in the log. DeepSpeed's Ulysses
(`deepspeed.runtime.sequence_parallel.ulysses_sp.UlyssesSPAttentionHF`) replaces transformers' `sdpa` attention
process-wide with an all-to-all that trades sequence sharding for head sharding: every rank of a group feeds its
part of the same rows and attention sees the whole sequence. Its groups are handed to `deepspeed.initialize` (`mpu`),
so gradients are summed over every rank and divided by the data-parallel ranks under ZeRO-1 and ZeRO-2, and by every
rank under ZeRO-3 (`gradient_divisor`): an objective scales its loss by what the engine divides by
(Dist.gradient_ranks).

A micro-batch is cut after its labels are shifted: position i predicts label i + 1, and the last position of a
part predicts the first token of the next part, which another rank holds. So a part carries one label more than it
has positions (trainer/loss/cross_entropy.py `shift` takes either width), its positions are explicit (the whole
row's, which Ulysses gathers for causal attention), and the row is padded to a multiple of the size with positions
whose label is ignored. Summed over a group, parts' target tokens and losses are the row's.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, TypeVar, cast

import torch
import torch.nn.functional as F

from config.sequence_parallel import heads_problem
from core.errors import UserError
from storage.shards import IGNORE_INDEX
from storage.spec import Spec
from trainer.data import Batch
from trainer.model.load import model_config
from trainer.parallel.distributed import Dist

log = logging.getLogger(__name__)

AnyBatch = TypeVar("AnyBatch")  # an objective's micro-batch: only sft's (a Batch) is ever split

ATTENTION = "sdpa"  # the attention Ulysses wraps here (flash-attention is the GPU's; eager needs a 4-D mask)


def start(spec: Spec, dist: Dist) -> Dist:
    """This rank's Dist with the run's sequence-parallel size; above 1, DeepSpeed's Ulysses registered with
    transformers and its groups checked against the layout (after the process group, before the model loads)."""
    remote = spec.config.model.trust_remote_code
    dist = split_sequences(dist, spec.config.train.sequence_parallel_size, spec.model_path, trust_remote_code=remote)
    return dataclasses.replace(dist, averaged_by=gradient_divisor(dist, spec.deepspeed))


def gradient_divisor(dist: Dist, ds_config: dict[str, Any]) -> int | None:
    """The ranks DeepSpeed 0.19 divides a step's summed gradient by, where that is not the data-parallel ranks (None).

    ZeRO-1 and ZeRO-2 divide by world / size (a sequence group's parts are parts of one gradient), but ZeRO-3's
    reduce-scatter (`reduce_scatter_coalesced`, its default path) divides by the whole world, sequence groups or not:
    a loss scaled for the data-parallel ranks would train with half the gradient at size 2 (Adam hides most of it;
    gradient clipping and its epsilon do not). ZeRO-3 without reduce-scatter divides one way or the other by bucket
    size, so it is refused with sequence parallelism."""
    zero = ds_config.get("zero_optimization", {})
    if dist.sequence_parallel == 1 or int(zero.get("stage", 0)) != 3:
        return None
    if not zero.get("reduce_scatter", True):
        raise UserError(
            f"train.sequence_parallel_size={dist.sequence_parallel} with ZeRO-3: the DeepSpeed config sets "
            "zero_optimization.reduce_scatter false, under which DeepSpeed averages some gradient buckets over the "
            "data-parallel ranks and others over every rank; remove it (reduce_scatter defaults to true)"
        )
    return dist.world_size


def split_sequences(dist: Dist, size: int, model_path: str, *, trust_remote_code: bool = False) -> Dist:
    """`dist` with sequence-parallel size `size`, and above 1 Ulysses registered for the model at `model_path` (one
    row a forward pass) and its groups checked against the layout."""
    if size == 1:
        return dist
    dist = dataclasses.replace(dist, sequence_parallel=size)
    config = model_config(model_path, trust_remote_code=trust_remote_code)
    heads = int(config["num_attention_heads"])
    if problem := heads_problem(size, heads, int(config.get("num_key_value_heads") or heads)):
        raise UserError(f"model.name_or_path {model_path}: {problem}")
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    mpu = UlyssesSPAttentionHF.register_with_transformers(model_path, ATTENTION, size, 1, seq_length_is_variable=True)
    ranks = torch.distributed.get_process_group_ranks(mpu.get_sequence_parallel_group())
    expected = dist.layout.sequence_groups()[dist.data_rank]
    assert ranks == expected, f"DeepSpeed's sequence group {ranks} is not the layout's {expected}"
    if dist.is_main:
        log.info("%s", dist.layout.describe())
    return dist


def groups(dist: Dist) -> Any:
    """DeepSpeed's sequence-parallel groups for `deepspeed.initialize(mpu=...)`; None without sequence parallelism."""
    if dist.sequence_parallel == 1:
        return None
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as mpu

    return mpu


def check_attention(model: Any, size: int) -> None:
    """The loaded model computes attention through the implementation Ulysses wraps (else it would run unsplit)."""
    used = getattr(model.config, "_attn_implementation", None)
    if size > 1 and used != ATTENTION:
        raise UserError(
            f"train.sequence_parallel_size={size}: the model loaded with attention {used!r}, which DeepSpeed's "
            f"Ulysses does not wrap here (only {ATTENTION!r}); set train.sequence_parallel_size=1 or use a model "
            f"whose attention transformers runs as {ATTENTION!r}"
        )


def shard(batch: AnyBatch, dist: Dist) -> AnyBatch:
    """This rank's part of every row of `batch` (the batch itself without sequence parallelism)."""
    size = dist.sequence_parallel
    if size == 1:
        return batch
    assert isinstance(batch, Batch), "the config refuses objectives other than sft with sequence parallelism"
    if batch.position_ids is not None:
        raise UserError(
            f"train.sequence_parallel_size={size}: the dataset holds packed rows, whose examples would attend to "
            "each other once split; stage it with data.packing=false"
        )
    rows, width = batch.input_ids.shape
    part = -(-width // size)
    extra = part * size - width
    start = dist.layout.sequence_rank(dist.rank) * part
    ids = F.pad(batch.input_ids, (0, extra))  # token 0 at the end: never a target, and causal attention ignores it
    mask = F.pad(batch.attention_mask, (0, extra))
    labels = F.pad(batch.labels, (0, extra + 1), value=IGNORE_INDEX)
    positions = torch.arange(part * size, dtype=torch.long).expand(rows, -1)
    end = start + part
    # gloo sends contiguous tensors only
    cut = (ids[:, start:end], mask[:, start:end], labels[:, start : end + 1], positions[:, start:end])
    ids, mask, labels, positions = (tensor.contiguous() for tensor in cut)
    return cast(AnyBatch, Batch(ids, mask, labels, positions))
