"""The node claim (launch/claim.py) on a real directory: a second live claim on a node rank names both nodes."""

from __future__ import annotations

import os
import socket

import pytest

from core.errors import UserError
from launch.claim import NodeClaim
from storage.location import Location


def test_a_second_live_claim_on_a_rank_names_both_nodes(tmp_path) -> None:
    run = Location(str(tmp_path))
    first = NodeClaim(run, 1, 3, "10.0.0.2")
    first.take()
    second = NodeClaim(run, 1, 3, "10.0.0.3")
    host = socket.gethostname()
    # Another live process on this host holds it: not stale (a real duplicate), whatever host it claims from.
    with pytest.raises(
        UserError,
        match=rf"duplicate NODE_RANK=1: nodes on {host} \(10.0.0.2\) and on {host} "
        r"\(10.0.0.3\) were both started as node 1; give every node a unique "
        r"NODE_RANK in 0..2",
    ):
        _as_other_process(second.take)
    first.release()
    second.take()  # released: free again
    assert os.path.exists(tmp_path / "nodes" / "1" / "claim.json")


def _as_other_process(call) -> None:
    """Run `call` in a forked child so that the claim's holder is another live process; re-raise its UserError."""
    import multiprocessing

    queue = multiprocessing.get_context("fork").SimpleQueue()

    def child() -> None:
        try:
            call()
            queue.put(None)
        except UserError as exc:
            queue.put(str(exc))

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(10)
    message = queue.get()
    if message:
        raise UserError(message)
