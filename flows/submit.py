"""Start a run of a pipeline deployment (finetune/manual, finetune/nightly) with a config from a preset and
--set overrides: the same API call as the UI's run form, from a shell.

    PREFECT_API_URL=http://127.0.0.1:4200/api python -m flows.submit finetune/manual --config tiny-cpu \
        --set run.storage=s3://tandem/tandem --set launch.backend=prefect --wait

Paths stay as written: relative ones are resolved by the worker, against its own checkout. The server checks
every value against the config's schema and refuses a bad one naming the field (exit 2).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from config.loader import DEFAULT_PRESET, apply_override, preset_path, read_yaml, validate
from core.errors import UserError
from flows.cli import add_config_arguments, config_yaml, run_cli
from launch.api_outage import ApiOutage, fail_fast, unreachable

if TYPE_CHECKING:
    from uuid import UUID

    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.objects import State

POLL_S = 2.0


def build_parameters(config: str | None, overrides: list[str]) -> dict:
    """The deployment's parameters: the validated config as JSON (paths not resolved here)."""
    path = preset_path(config or DEFAULT_PRESET)
    tree = read_yaml(path)
    for assignment in overrides:
        apply_override(tree, assignment)
    origin = f"config {path.name}" + (" with --set" if overrides else "")
    return {"config": validate(tree, origin).model_dump(mode="json")}


def submit(deployment: str, parameters: dict, wait: bool) -> int:
    """Create the flow run; with wait, follow it to its final state (exit 0 only when Completed)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError

    with get_client(sync_client=True) as client:
        try:
            target = client.read_deployment_by_name(deployment)
        except ObjectNotFound:
            raise UserError(
                f"deployment {deployment} not found on {client.api_url}; deploy it with python tools/deploy.py"
            ) from None
        try:
            run = client.create_flow_run_from_deployment(target.id, parameters=parameters)
        except PrefectHTTPStatusError as exc:
            raise UserError(
                f"{deployment}: the server refused the parameters: "
                f"{exc.response.json().get('detail', exc.response.text)}"
            ) from None
        print(f"flow run {run.name} ({run.id}) of {deployment} created on {client.api_url}")
        if not wait:
            return 0
        outage = ApiOutage(
            parameters["config"]["launch"]["api_outage_s"],
            "the run goes on on its workers",
            f"the run may still be going: follow flow run {run.id} in the UI once the API is back",
        )
        while not (state := read_state(client, run.id, outage)) or not state.is_final():
            time.sleep(POLL_S)
        print(f"flow run {run.name}: {state.name}" + (f" ({state.message})" if state.message else ""))
        return 0 if state.is_completed() else 1


def read_state(client: SyncPrefectClient, run_id: UUID, outage: ApiOutage) -> State | None:
    """The flow run's state; None while the API does not answer (up to the outage's limit)."""
    try:
        with fail_fast():
            state = client.read_flow_run(run_id).state
    except Exception as exc:
        if not unreachable(exc):
            raise
        outage.failed(exc)
        return None
    outage.answered()
    return state


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m flows.submit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("deployment", help="FLOW/DEPLOYMENT, e.g. finetune/manual")
    add_config_arguments(parser)
    parser.add_argument("--wait", action="store_true", help="follow the run until it ends")
    args = parser.parse_args(argv)

    def body() -> int:
        parameters = build_parameters(args.config, args.overrides)
        if args.print_config:  # what the server receives: paths as written, resolved later by the worker
            print(config_yaml(parameters["config"]), end="")
            return 0
        return submit(args.deployment, parameters, args.wait)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
