"""One live pipeline per run: a lease object `{run}/LOCK`, claimed with an exclusive create.

Re-running a `run.name` continues that run, so two pipelines started with the same name would train into the
same checkpoints. The first to create LOCK (link() locally, a conditional PUT on S3: atomic either way) holds
the run; the other is refused with one line naming the holder. The holder refreshes the lease's expiry while it
runs and deletes LOCK when it ends, completed or failed. A holder that crashed cannot delete it: once its lease
has expired, the next pipeline takes the lock over with a compare-and-swap on the stale document, so two
pipelines that find the same stale lock cannot both win. Expiry compares wall clocks across hosts: keep them in
NTP sync, and the lease (TANDEM_RUN_LOCK_LEASE_S, default 120 s) well above any skew.

Taking a run back after its pipeline died (killed, its host lost): a holder that is gone (its pid is dead on this
host, or it missed two renewals) is waited for until its lease expires, then taken over; with run.take_over it is
taken over at once. A holder that is provably alive (its process lives on this host, or it renewed within half a
lease) is refused either way, as a second pipeline on a live run always is.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from core.errors import UserError
from core.processes import pid_alive
from storage import layout
from storage.conditional import create_exclusive, read_versioned, replace_if_unchanged
from storage.fs import remove
from storage.location import Location

log = logging.getLogger(__name__)
LEASE_ENV = "TANDEM_RUN_LOCK_LEASE_S"
DEFAULT_LEASE_S = 120.0
MAX_ATTEMPTS = 20


def lease_seconds() -> float:
    """How long a lock stays valid without a refresh (TANDEM_RUN_LOCK_LEASE_S, default 120)."""
    raw = os.environ.get(LEASE_ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_LEASE_S
    except ValueError:
        raise UserError(f"{LEASE_ENV}={raw!r}: expected a number of seconds, e.g. {LEASE_ENV}=120") from None
    if value <= 0:
        raise UserError(f"{LEASE_ENV}={raw!r}: must be > 0")
    return value


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


class RunLock:
    """The lease on one run directory, held by this process; `hold()` wraps a pipeline in it."""

    def __init__(
        self,
        run_url: Location,
        run_id: str,
        flow_run_id: str | None,
        lease_s: float | None = None,
        logger: logging.Logger | logging.LoggerAdapter = log,
    ) -> None:
        self.log = logger  # the flow's run logger, so that takeovers and lost leases show in the run's logs
        self.url = layout.run_lock_url(run_url)
        self.run_id = run_id
        self.lease_s = lease_s if lease_s is not None else lease_seconds()
        self.token = secrets.token_hex(16)  # tells our lock from another holder's, even on the same host
        self.since = time.time()
        self.holder = {"flow_run_id": flow_run_id, "host": socket.gethostname(), "pid": os.getpid()}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def document(self) -> bytes:
        """The LOCK bytes: who holds the run, since when, and until when the lease lasts."""
        now = time.time()
        doc = {
            "schema": layout.LOCK_SCHEMA,
            "run_id": self.run_id,
            "token": self.token,
            **self.holder,
            "since": _iso(self.since),
            "renewed_at": now,
            "expires_at": now + self.lease_s,
        }
        return (json.dumps(doc, sort_keys=True) + "\n").encode()

    def acquire(self, take_over: bool = False) -> None:
        """Claim the run, take over an expired lock, or raise a UserError naming the live holder. A holder that is
        gone (its process is dead on this host, or it missed two renewals) is waited for until its lease expires, or
        with `take_over` replaced at once; a holder that is provably alive is refused either way."""
        for _ in range(MAX_ATTEMPTS):
            if create_exclusive(self.url, self.document()):
                return
            data, token = read_versioned(self.url)
            if data is None:
                continue  # released between our create and our read: try to create it again
            current = _parse(data)
            if current.get("token") == self.token:
                return
            if current.get("expires_at", 0) > time.time():
                if not self._gone(current):
                    raise UserError(_refusal(self.run_id, current))
                if not take_over:
                    self._wait_for_expiry(current)
                    continue
            if replace_if_unchanged(self.url, self.document(), token):
                self.log.warning(
                    "run %s: took over the lock of flow run %s on %s (pid %s), whose lease expired at %s",
                    self.run_id,
                    current.get("flow_run_id"),
                    current.get("host"),
                    current.get("pid"),
                    _iso(current.get("expires_at", 0)),
                )
                return
        raise UserError(
            f"{self.url}: could not claim the run lock after {MAX_ATTEMPTS} attempts (other pipelines "
            "keep taking it); wait for them or choose another run.name"
        )

    def _gone(self, holder: dict[str, Any]) -> bool:
        """Whether the holder is not provably alive and gone by what can be seen: its process is dead on this host, or
        (on another host) it missed two renewals (it renews every quarter of the lease)."""
        if holder.get("host") == socket.gethostname():
            return not pid_alive(holder.get("pid"))
        return time.time() - float(holder.get("renewed_at", 0)) > self.lease_s / 2

    def _wait_for_expiry(self, holder: dict[str, Any]) -> None:
        """Wait until a gone holder's lease expires (a renewal meanwhile means it lives: the next look refuses)."""
        left = float(holder.get("expires_at", 0)) - time.time()
        self.log.warning(
            "run %s: the pipeline holding it (flow run %s on %s, pid %s) is gone; waiting %.0f s for its lease to "
            "expire (run.take_over=true takes it over at once)",
            self.run_id,
            holder.get("flow_run_id"),
            holder.get("host"),
            holder.get("pid"),
            left,
        )
        time.sleep(max(0.0, left) + 0.1)

    def renew(self) -> bool:
        """Extend the lease; False when the lock is no longer ours (it expired and was taken over)."""
        data, token = read_versioned(self.url)
        if data is None or _parse(data).get("token") != self.token:
            return False
        return replace_if_unchanged(self.url, self.document(), token)

    def release(self) -> None:
        """Delete LOCK if it is still ours (a lock taken over by another pipeline stays).

        Read, then delete: not atomic, but a takeover in between needs our lease to have expired first, which
        the heartbeat prevents while this process is alive.
        """
        data, _ = read_versioned(self.url)
        if data is not None and _parse(data).get("token") == self.token:
            remove(self.url)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.lease_s / 4):
            try:
                if not self.renew():
                    self.log.error(
                        "run %s: lost the run lock %s (its lease expired and another pipeline took it over)",
                        self.run_id,
                        self.url,
                    )
                    return
            except Exception as exc:  # noqa: BLE001 - a failed refresh is retried at the next beat
                self.log.warning(
                    "run %s: could not renew the run lock (%s); retrying in %.0f s", self.run_id, exc, self.lease_s / 4
                )

    @contextlib.contextmanager
    def hold(self, take_over: bool = False) -> Iterator[RunLock]:
        """Acquire (see `acquire`), keep the lease fresh while the body runs, release when it ends however it ends."""
        self.acquire(take_over)
        self._thread = threading.Thread(target=self._heartbeat, name=f"run-lock-{self.run_id}", daemon=True)
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(timeout=5)
            self.release()


def _parse(data: bytes) -> dict[str, Any]:
    """The LOCK document; an unreadable one counts as expired (no live holder writes garbage)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _refusal(run_id: str, holder: dict[str, Any]) -> str:
    """The one line a second pipeline gets."""
    return (
        f"run {run_id} is already running (flow run {holder.get('flow_run_id')} on {holder.get('host')} "
        f"pid {holder.get('pid')} since {holder.get('since')}); wait for it, cancel it, or choose another "
        f"run.name (a crashed run's lock expires at {_iso(holder.get('expires_at', 0))}; once it stopped renewing, "
        "a rerun waits for that, or takes the run over at once with run.take_over=true)"
    )
