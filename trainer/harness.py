"""The life of one rank, the same for `python -m trainer` and `python -m trainer.evaluate`: spec.json read (where its
--spec says, with the storage options given there) and validated, the process group, the log format, the body, a
user's error as one line (and its exit code), and the shutdown whatever happened."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

from core.errors import TandemError
from core.rank_log import ERROR_LOGGER
from core.redact import install_log_masking
from storage.location import Location
from storage.spec import Spec, load_spec
from trainer.parallel.distributed import Dist
from trainer.watch.crash import crash_exit_code, crash_line, storage_full_on_rank
from trainer.watch.faults import Faults

# What a rank runs once it has its spec, its place in the job and the faults a test injects (none in production).
Body = Callable[[Spec, Dist, Faults], object]


def run_rank(spec_url: Location, body: Body, *, deepspeed_backend: bool) -> int:
    """Run `body(spec, dist, faults)` on this rank, for the spec.json at `spec_url` (its --spec: reached with the
    options its launcher gave with it); returns the process exit code (0, or the error's). The faults a test injects
    are read from the environment once, here (trainer/watch/faults.py)."""
    from trainer.logging_setup import configure
    from trainer.model.lean_imports import skip_unused_libraries
    from trainer.parallel import distributed

    spec: Spec | None = None
    try:
        spec, _ = load_spec(spec_url)
        skip_unused_libraries(spec.config.train.method, training=deepspeed_backend)  # the train entry's DeepSpeed
        launch = spec.config.launch
        dist = distributed.init(
            deepspeed_backend=deepspeed_backend,
            timeout_s=launch.collective_timeout,
            connect_timeout_s=launch.rdzv_timeout,
        )
        configure(dist)
        install_log_masking(spec.config.launch.forward_env)
        faults = Faults.from_environment(os.environ)
        faults.record_env_digest(spec.run, dist.node_rank, dist.rank)
        body(spec, dist, faults)
    except TandemError as exc:
        logging.getLogger(ERROR_LOGGER).error("%s", exc)
        return exc.exit_code
    except Exception as exc:
        # The traceback stays in the node's log; the launcher reads the one line below back as the rank's error.
        if (full := storage_full_on_rank(exc, spec)) is not None:
            # The one line first: on a full disk the traceback may not fit in the log (the partial file is gone).
            logging.getLogger(ERROR_LOGGER).error("%s", full)
            logging.getLogger(__name__).exception("the write that found storage full")
            return full.exit_code
        logging.getLogger(__name__).exception("uncaught error on this rank")
        logging.getLogger(ERROR_LOGGER).error("%s", crash_line(exc))
        return crash_exit_code(exc)
    finally:
        distributed.shutdown()
    return 0


def exit_now(code: int) -> None:
    """End the rank's process with `code` once its output is flushed, skipping the interpreter's teardown.

    With torch, DeepSpeed, transformers and PEFT loaded, Python's own exit (finalizing every module) takes 1-2 s
    of CPU per rank after the work is done, and every launch waits for its slowest rank. Everything the rank
    wrote is closed by then (storage writes are atomic renames), so only the log handlers and the standard
    streams need flushing. Used only when `run_rank` returned: an uncaught exception exits the usual way.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
