"""Log format for ranks: every line carries the rank, so interleaved node logs stay readable."""

from __future__ import annotations

import logging

from trainer.distributed import Dist


def configure(dist: Dist) -> None:
    """INFO on rank 0, WARNING elsewhere (errors from every rank still reach the node log)."""
    logging.basicConfig(
        level=logging.INFO if dist.is_main else logging.WARNING,
        format=f"%(asctime)s [rank {dist.rank}/{dist.world_size} {dist.host}] %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    for noisy in ("DeepSpeed", "deepspeed", "torch.distributed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
