"""The life of one rank, the same for `python -m trainer` and `python -m trainer.evaluate`: the storage options the
launcher handed down, spec.json read and validated, the process group, the log format, the body, a user's
error as one line (and its exit code), and the shutdown whatever happened."""

from __future__ import annotations

import logging
from collections.abc import Callable

from config.errors import TandemError
from config.rank_log import ERROR_LOGGER
from storage.fs import use_environment_options
from storage.spec import Spec, load_spec
from trainer.distributed import Dist


def run_rank(spec_url: str, body: Callable[[Spec, Dist], object], *, deepspeed_backend: bool) -> int:
    """Run `body(spec, dist)` on this rank; returns the process exit code (0, or the error's)."""
    from trainer import distributed
    from trainer.logging_setup import configure

    use_environment_options()
    try:
        spec, _ = load_spec(spec_url)
        dist = distributed.init(deepspeed_backend=deepspeed_backend, timeout_s=spec.config.launch.collective_timeout)
        configure(dist)
        body(spec, dist)
    except TandemError as exc:
        logging.getLogger(ERROR_LOGGER).error("%s", exc)
        return exc.exit_code
    finally:
        distributed.shutdown()
    return 0
