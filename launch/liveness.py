"""No orphans: the nodes of a phase stop when the pipeline that started it is gone (killed, its host lost).

The pipeline renews `{run}/nodes/pipeline.json` every RENEW_S while a phase runs (`PipelineBeat`, started by
launch/phase.py for every backend), and removes it when the phase ends. Every node process follows it
(`PipelineWatch`, a poller of launch/node.py): a record seen unchanged for STALE_S on the node's own monotonic clock
(no clock comparison across hosts) means its writer is gone, and the node stops as on a cancel: its ranks get SIGTERM
and the cancel's grace (they save first with launch.checkpoint_on_cancel or train.preempt_grace_s), and it leaves
the stop note for the others. A node that cannot read the record (a storage outage) counts it as renewed: an outage
is the storage-fault rules' business, never a sign of the pipeline's death. A node that finds no record when it
starts, or only one written long before (a node started by hand, after an earlier pipeline died), follows none.

The local backend's nodes are threads of the pipeline's process: there the parent-death signal stops the agents
(`launch/agent.py`: PR_SET_PDEATHSIG, SIGTERM when the node thread that started the agent dies, kill -9 included).
The ssh backend keeps its own rule as well (end of its input or `lost_s` without a line stops a node).

Bound (documented in docs/operations.md): STALE_S (15 s) + one poll (RENEW_S, 2 s) + the agent's grace (10 s, or
launch.cancel_grace_s with launch.checkpoint_on_cancel), and a storage call's own retries while storage answers slowly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from core.errors import RetryableError
from storage import layout
from storage.fs import exists, read_bytes, remove, write_json_atomic
from storage.location import Location, join

log = logging.getLogger(__name__)
PIPELINE = "pipeline.json"
RENEW_S = 2.0
STALE_S = 15.0
# A record whose writer's clock says it was renewed longer ago than this, read by a node that just started, is an
# earlier pipeline's: the node follows none (clocks agree to a few seconds, as for node claims).
FRESH_S = 60.0


def record_url(run_url: Location) -> Location:
    """{run}/nodes/pipeline.json"""
    return join(run_url, layout.NODES, PIPELINE)


class PipelineGone(RetryableError):
    """The pipeline that started this phase stopped renewing its record: this node stops (a rerun resumes)."""


class PipelineBeat:
    """The pipeline's side: renew the record every RENEW_S in a thread while `hold()` is open."""

    def __init__(self, run_url: Location) -> None:
        self.url = record_url(run_url)
        self.token = uuid.uuid4().hex
        self.beat = 0
        self._stop = threading.Event()

    def write(self) -> None:
        """One renewal: the beat counter is what nodes see change."""
        self.beat += 1
        doc = {"token": self.token, "beat": self.beat, "host": socket.gethostname(), "pid": os.getpid()}
        write_json_atomic(self.url, {**doc, "renewed_at": time.time()})

    def _run(self) -> None:
        while not self._stop.wait(RENEW_S):
            try:
                self.write()
            except Exception as exc:  # noqa: BLE001 - the next beat tries again; nodes count an outage as alive
                log.warning("could not renew %s: %s", self.url, exc)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Write the record, renew it while the body runs, remove it afterwards."""
        self.write()
        thread = threading.Thread(target=self._run, name="pipeline-beat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            self._stop.set()
            thread.join(timeout=RENEW_S + 5)
            with contextlib.suppress(Exception):
                remove(self.url)


class PipelineWatch:
    """A node's side: a poller that raises PipelineGone once the record was seen unchanged (or gone) for STALE_S."""

    def __init__(self, run_url: Location, stale_s: float = STALE_S) -> None:
        self.url = record_url(run_url)
        self.stale_s = stale_s
        self._seen: bytes | None = None
        self._changed = time.monotonic()
        self._polled = 0.0
        self.following = self._first_look()

    def _first_look(self) -> bool:
        try:
            data = read_bytes(self.url) if exists(self.url) else None
        except Exception:  # noqa: BLE001 - unreadable now: follow it (an outage never counts as the pipeline's death)
            return True
        if data is None or time.time() - _renewed_at(data) > FRESH_S:
            return False
        self._seen = data
        return True

    def poll(self) -> None:
        """Every RENEW_S: note a change; raise once nothing changed for stale_s."""
        now = time.monotonic()
        if not self.following or now - self._polled < RENEW_S:
            return
        self._polled = now
        try:
            data = read_bytes(self.url) if exists(self.url) else None
        except Exception:  # noqa: BLE001 - a storage outage: the pipeline may be alive, keep training
            self._changed = now
            return
        if data is not None and data != self._seen:
            self._seen, self._changed = data, now
            return
        if now - self._changed >= self.stale_s:
            state = "removed" if data is None else "unchanged"
            raise PipelineGone(
                f"the pipeline that started this phase is gone: {self.url} {state} for {now - self._changed:.0f} s "
                "(killed, or its host lost); this node stops its ranks (saving first with "
                "launch.checkpoint_on_cancel); run the pipeline again to resume"
            )


def _renewed_at(data: bytes) -> float:
    try:
        doc: Any = json.loads(data)
        return float(doc["renewed_at"])
    except (ValueError, KeyError, TypeError):
        return 0.0
