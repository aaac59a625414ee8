"""The wait through an outage of the Prefect API (its server restarted, upgraded, its database failing over), which is
not a failure of the training.

The nodes never need the API to train: they read the spec and data from storage, rendezvous with each other, and
follow the pipeline's liveness record on storage (launch/liveness.py). Only bookkeeping talks to the API while they
train: the `prefect` backend reading its node flow runs' states (launch/backends/prefect.py), the train task's
progress artifact (tasks/train.py), and `python -m flows.submit --wait` following a run. Those calls fail fast here
(no client retries: Prefect's own back off for about a minute per call, and would hold the supervise loop and its
stall watch that long), count as "no news", and only an outage longer than its limit (`launch.api_outage_s`) fails
what waits, with exit 75 (a retry may help once the API is back).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

import httpx
from prefect.exceptions import PrefectHTTPStatusError
from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

from core.errors import RetryableError

log = logging.getLogger(__name__)
RERUN = (
    "bring it back and run the pipeline again (it resumes from the newest complete checkpoint), or raise "
    "launch.api_outage_s"
)


def unreachable(exc: BaseException) -> bool:
    """The API did not answer (no connection, a timeout) or answered that it cannot serve now: HTTP 5xx (a proxy in
    front of a server that is restarting, a server whose database is failing over) or 429 (Prefect Cloud's rate
    limit, which Prefect's own retries would have waited out)."""
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, PrefectHTTPStatusError) and (
        exc.response.status_code >= 500 or exc.response.status_code == 429
    )


@contextlib.contextmanager
def fail_fast() -> Iterator[None]:
    """API calls in this block raise at the first failure instead of after Prefect's retries (this thread only)."""
    with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0}):
        yield


class ApiOutage:
    """Counts how long the API has been unreachable, one line when it goes and when it comes back; raises past the
    limit."""

    def __init__(self, limit_s: float, doing: str, fix: str = RERUN) -> None:
        self.limit_s = limit_s
        self.doing = doing  # what goes on meanwhile, for the lines: "the nodes keep training"
        self.fix = fix  # what to do once it gave up
        self.since: float | None = None
        self.happened = False  # whether the API has been away at all

    def failed(self, exc: BaseException) -> None:
        """A call failed because the API is unreachable: note it, or raise once that has lasted limit_s."""
        now = time.monotonic()
        self.happened = True
        if self.since is None:
            self.since = now
            log.warning(
                "the Prefect API at %s does not answer (%s); %s, waiting up to %.0f s (launch.api_outage_s)",
                PREFECT_API_URL.value(),
                reason(exc),
                self.doing,
                self.limit_s,
            )
        elif now - self.since > self.limit_s:
            raise RetryableError(
                f"the Prefect API at {PREFECT_API_URL.value()} has not answered for {now - self.since:.0f} s "
                f"({reason(exc)}); {self.fix}"
            ) from None

    def answered(self) -> None:
        """A call went through: the outage, if any, is over."""
        if self.since is not None:
            log.warning("the Prefect API answers again after %.0f s", time.monotonic() - self.since)
            self.since = None


def reason(exc: BaseException) -> str:
    """The failure in a few words: the HTTP status, or the transport error's class and first line."""
    if isinstance(exc, PrefectHTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}"
