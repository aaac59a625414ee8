"""Evaluate a model on the eval split on one rank of a torchrun job (the stage itself: trainer/evaluation/stage.py).

    torchrun ... -m trainer.evaluate --spec {run}/spec.json --model {run}/final
    torchrun ... -m trainer.evaluate --spec {run}/spec.json --model {run}/checkpoints/step-00000030

Exit codes: 0 done, 2 bad config or data (a retry cannot help), 75 retryable, 1 anything else.
"""

from __future__ import annotations

import argparse

from storage.location import ARGUMENT_FORM, location_argument


def main(argv: list[str] | None = None) -> int:
    """CLI entry for one rank."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer.evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spec", required=True, type=location_argument, help=f"the run's spec.json: {ARGUMENT_FORM}")
    parser.add_argument(
        "--model",
        required=True,
        type=location_argument,
        help=f"an exported model (final/) or a checkpoint (checkpoints/step-N), with COMPLETE: {ARGUMENT_FORM}",
    )
    args = parser.parse_args(argv)
    from trainer.evaluation.stage import evaluate
    from trainer.harness import run_rank

    return run_rank(args.spec, lambda spec, dist, _faults: evaluate(spec, args.model, dist), deepspeed_backend=False)


if __name__ == "__main__":
    from trainer.harness import exit_now

    exit_now(main())
