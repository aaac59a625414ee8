"""train.tiled_mlp (trainer/model/tiled_mlp.py) under real DeepSpeed engines on 2 gloo ranks: ZeRO-2 and ZeRO-3, LoRA
and
full fine-tuning, rank 0's rows of 300 tokens (3 tiles of the tiny model's 128) and rank 1's of 140 (2 tiles: under
ZeRO-3 the ranks agree on 3, each fetch of the partitioned weights being a collective). Each rank compares its summed
loss and every parameter's full gradient (after DeepSpeed's backward, averaged over the ranks) with the untiled MLP's
on the same engine.

The rank side of test_tiled_mlp.py's test_tiled_mlps_under_deepspeed_on_two_ranks, launched through
tests/unit/trainer/loss/chunked_zero3_ranks.py's launcher (the module name swapped)."""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

TOLERANCE = 1e-5  # test_tiled_mlp.py's GRAD_RTOL: the tiles' products and their summed gradients against one product
WIDTHS = (300, 140)


def loss_and_grads(engine: Any, head: Any, inputs: tuple) -> tuple[Any, dict[str, Any]]:
    from deepspeed.utils import safe_get_full_grad

    ids, mask, labels = inputs
    loss = head.summed(engine(input_ids=ids, attention_mask=mask, **head.forward_kwargs(ids.device)), labels)
    engine.backward(loss)
    grads = {n: safe_get_full_grad(p).clone() for n, p in engine.module.named_parameters() if p.requires_grad}
    engine.step()  # SGD at lr 0: the weights stay, the gradients clear
    return loss.detach(), grads


def main(out_dir: Path) -> None:
    import deepspeed
    import torch

    from tests.unit.trainer.loss.chunked_zero3_ranks import COLLECTIVE_TIMEOUT_S, engine_for
    from tests.unit.trainer.loss.test_chunked import batch, head_of
    from trainer.model.tiled_mlp import tile_mlps

    rank = int(os.environ["RANK"])
    deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    result = {}
    for stage in (2, 3):
        for method in ("lora", "full"):
            engine = engine_for(stage, method)
            head = head_of(engine, 0)
            inputs = batch(width=WIDTHS[rank])
            want_loss, want = loss_and_grads(engine, head, inputs)
            assert tile_mlps(engine.module) == 2
            got_loss, got = loss_and_grads(engine, head, inputs)
            torch.testing.assert_close(got_loss, want_loss, rtol=TOLERANCE, atol=0)
            assert got.keys() == want.keys()
            for name, grad in want.items():
                scale = float(grad.abs().max())
                torch.testing.assert_close(got[name], grad, rtol=TOLERANCE, atol=TOLERANCE * scale, msg=name)
            result[f"zero{stage}-{method}"] = len(want)
    (out_dir / f"rank-{rank}.json").write_text(json.dumps(result))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    sys.stdout.flush()  # as chunked_zero3_ranks.py: skip a teardown that may abort after the result was written
    sys.stderr.flush()
    os._exit(0)
