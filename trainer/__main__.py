"""Train on one rank of a torchrun job.

    torchrun --nnodes N --nproc-per-node P --node-rank R --master-addr A --master-port PORT \
        -m trainer --spec {storage}/runs/{run_id}/spec.json

Exit codes: 0 done, 2 bad config or data (a retry cannot help), 75 retryable, 1 anything else.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from storage.location import ARGUMENT_FORM, location_argument

if TYPE_CHECKING:
    from storage.spec import Spec
    from trainer.parallel.distributed import Dist
    from trainer.watch.faults import Faults


def main(argv: list[str] | None = None) -> int:
    """Parse, build, train, tear down."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spec", required=True, type=location_argument, help=f"the run's spec.json: {ARGUMENT_FORM}")
    args = parser.parse_args(argv)
    from trainer.harness import run_rank
    from trainer.loop import train
    from trainer.watch.probe import run_probe

    def probe_then_train(spec: Spec, dist: Dist, faults: Faults) -> None:
        run_probe(spec, dist)
        train(spec, dist, faults)

    return run_rank(args.spec, probe_then_train, deepspeed_backend=True)


if __name__ == "__main__":
    from trainer.harness import exit_now

    exit_now(main())
