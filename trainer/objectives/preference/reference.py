"""The preference objectives' reference model: the policy's own base, and what it is asked.

The reference of dpo, ipo and kto is the policy's own base: the same model with its LoRA adapters disabled (PEFT's
`disable_adapter()`), run without gradients before the policy's pass; no second model is loaded. Under full
fine-tuning, dpo's and ipo's reference log-probabilities are looked up in the table the base computed before
training (reference_table.py): `run_tables` makes or reads it for a training run, `eval_tables` reads the eval
split's for the evaluate stage.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from config.deepspeed import zero_stage
from core.errors import UserError
from storage.node_cache import cache_root
from storage.spec import Spec
from storage.split_reader import Split
from trainer.data import Batch, split_of
from trainer.loss.chunked import LossHead
from trainer.objectives.policy import Policy
from trainer.objectives.preference import reference_table
from trainer.objectives.preference.batching import PreferenceBatch
from trainer.objectives.preference.reference_table import ReferenceTable, load_or_compute
from trainer.parallel.distributed import Dist


@contextmanager
def adapters_off(policy: Policy) -> Iterator[None]:
    """The reference model: the policy's model (a DeepSpeed engine, a PEFT model) with its adapters disabled."""
    peft = getattr(policy.module, "module", policy.module)
    disable = getattr(peft, "disable_adapter", None)  # PEFT's context manager
    if disable is None:
        raise RuntimeError("the reference model is the policy with its adapters disabled: a LoRA model is needed")
    with disable():
        yield


def logps(policy: Policy, batch: Batch, head: LossHead) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed target log-probability, target count) of every sequence of `batch`, in one forward pass, through the
    loss `head` (trainer/loss/chunked.py: from the last hidden states a chunk of targets at a time, or full logits)."""
    out = policy.forward(batch, head.forward_kwargs(policy.device))
    return head.sequence_logps(out, batch.labels)


def reference_logps(policy: Policy, batch: Batch, head: LossHead) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference model's log-probabilities of `batch`, without gradients."""
    with torch.no_grad(), adapters_off(policy):
        return logps(policy, batch, head)


def reference_for(policy: Policy, batch: PreferenceBatch, table: ReferenceTable | None, head: LossHead) -> torch.Tensor:
    """The reference log-probabilities of a micro-batch's sequences: looked up in full fine-tuning's `table`, else
    computed by the model with its adapters disabled."""
    if table is not None:
        return table.logps(batch.indices, policy.device)
    return reference_logps(policy, batch.sequences, head)[0]


def kl_sums(policy: Policy, batch: PreferenceBatch, head: LossHead) -> tuple[float, int]:
    """KTO: (summed policy - reference log-probability of the mismatched sequences, their count), no gradients."""
    assert batch.mismatched is not None, "KTO micro-batch without its mismatched sequences"
    with torch.no_grad():
        policy_logps, _ = logps(policy, batch.mismatched, head)
    reference, _ = reference_logps(policy, batch.mismatched, head)
    return float((policy_logps - reference).sum()), batch.units


def run_tables(engine: torch.nn.Module, spec: Spec, dist: Dist, pad_id: int) -> dict[str, ReferenceTable]:
    """Full fine-tuning's reference log-probabilities of each non-empty split, from the run directory or computed by
    the engine's model as loaded: called before any checkpoint is resumed, so that the model is the base."""
    engine.eval()  # the reference has no dropout
    tables = {}
    for split in ("train", "eval"):
        rows = split_of(spec, split)
        if len(rows):
            lockstep = zero_stage(spec.deepspeed) == 3
            head = LossHead.of(engine, spec.config.train.loss_chunk_tokens)
            batching = {"batch_size": spec.config.train.micro_batch_size, "pad_id": pad_id, "lockstep": lockstep}
            cache = cache_root(spec.config.launch.node_cache_dir)  # where a table on S3 is copied to be mapped
            tables[split] = load_or_compute(engine, spec.run, split, rows, dist, cache, head=head, **batching)
    engine.train()
    return tables


def eval_tables(spec: Spec, rows: Split, name: str) -> dict[str, ReferenceTable]:
    """The eval split's table that the train stage wrote (a run that never trained has none: one line says so)."""
    table = reference_table.load(spec.run, "eval", len(rows), cache_root(spec.config.launch.node_cache_dir))
    if table is None:
        raise UserError(
            f"{reference_table.table_url(spec.run, 'eval')}: missing; full fine-tuning's {name} reference "
            "log-probabilities are written by the train stage before its first step: train the run first"
        )
    return {"eval": table}
