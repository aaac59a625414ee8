"""Liger's fused linear cross-entropy (trainer/loss/liger.py) under a real ZeRO-3 engine on 2 gloo ranks, under
Triton's interpreter (TRITON_INTERPRET=1): the output layer's weight is partitioned (empty on every rank) and the fused
loss reads it directly, the failure of Liger's issue 1048 unless it is gathered first. Each rank compares its summed
loss and every parameter's full gradient (after DeepSpeed's backward, averaged over the ranks) with the chunked loss's
on the same engine, at test_liger.py's tolerance; the ranks' batches differ in their target counts.

The rank side and its test: test_liger_zero3 launches this module on 2 ranks through chunked_zero3_ranks.py's
launcher (the module name swapped, as tests/unit/trainer/test_step.py does)."""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

TOLERANCE = 1e-5  # test_liger.py's: Liger's blockwise log-sum-exp against the chunked loss, in float32


def summed_loss_and_grads(engine: Any, head: Any, inputs: tuple) -> tuple[Any, dict[str, Any]]:
    """`head`'s summed loss on `inputs` and every trainable parameter's full gradient after DeepSpeed's backward."""
    from deepspeed.utils import safe_get_full_grad

    ids, mask, labels = inputs
    loss = head.summed(engine(input_ids=ids, attention_mask=mask, **head.forward_kwargs(ids.device)), labels)
    engine.backward(loss)
    grads = {n: safe_get_full_grad(p).clone() for n, p in engine.module.named_parameters() if p.requires_grad}
    engine.step()  # SGD at lr 0 (chunked_zero3_ranks.engine_for): the weights stay, the gradients clear
    return loss.detach(), grads


def main(out_dir: Path) -> None:
    import deepspeed
    import torch

    from tests.unit.trainer.loss.chunked_zero3_ranks import COLLECTIVE_TIMEOUT_S, engine_for, rank_batch
    from tests.unit.trainer.loss.test_chunked import CHUNK, head_of
    from trainer.loss.liger import LigerLossHead

    rank = int(os.environ["RANK"])
    deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    engine = engine_for(3, "full")
    inputs = rank_batch(rank)
    chunked = head_of(engine, CHUNK)
    fused = LigerLossHead.of_head(chunked)
    assert type(fused) is LigerLossHead and fused.partitioned, "ZeRO-3's plain Linear head takes the fused loss"
    assert engine.module.lm_head.weight.numel() == 0, "the head's weight is partitioned away between uses"
    want_loss, want = summed_loss_and_grads(engine, chunked, inputs)
    got_loss, got = summed_loss_and_grads(engine, fused, inputs)
    torch.testing.assert_close(got_loss, want_loss, rtol=TOLERANCE, atol=0)
    assert got.keys() == want.keys() and "lm_head.weight" in want
    for name, grad in want.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(got[name], grad, rtol=TOLERANCE, atol=TOLERANCE * float(grad.abs().max()), msg=name)
    result = {"loss": float(got_loss), "gradients": len(want)}
    (out_dir / f"rank-{rank}.json").write_text(json.dumps(result))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    sys.stdout.flush()  # as chunked_zero3_ranks.py: skip a teardown that may abort after the result was written
    sys.stderr.flush()
    os._exit(0)
