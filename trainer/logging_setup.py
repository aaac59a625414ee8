"""Log format for ranks (defined with its parser in core/rank_log.py)."""

from __future__ import annotations

import logging

from core.rank_log import line_format
from trainer.parallel.distributed import Dist


def configure(dist: Dist) -> None:
    """INFO on rank 0, WARNING elsewhere (errors from every rank still reach the node log)."""
    logging.basicConfig(
        level=logging.INFO if dist.is_main else logging.WARNING,
        format=line_format(dist.rank, dist.world_size, dist.host),
        force=True,
    )
    for noisy in ("DeepSpeed", "deepspeed", "torch.distributed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
