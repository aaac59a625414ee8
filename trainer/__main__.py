"""Train on one rank of a torchrun job.

    torchrun --nnodes N --nproc-per-node P --node-rank R --master-addr A --master-port PORT \
        -m trainer --spec {storage}/runs/{run_id}/spec.json

Exit codes: 0 done, 2 bad config or data (a retry cannot help), 75 retryable, 1 anything else.
"""

from __future__ import annotations

import argparse
import logging
import sys

from config.errors import TandemError
from storage.spec import load_spec


def main(argv: list[str] | None = None) -> int:
    """Parse, build, train, tear down."""
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", required=True, help="URL of the run's spec.json")
    args = parser.parse_args(argv)
    from trainer import distributed
    from trainer.logging_setup import configure

    try:
        spec, _ = load_spec(args.spec)
        dist = distributed.init(deepspeed_backend=True, timeout_s=spec.config.launch.collective_timeout)
        configure(dist)
        from trainer.loop import train

        train(spec, dist)
    except TandemError as exc:
        logging.getLogger("trainer").error("%s", exc)
        return exc.exit_code
    finally:
        distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
