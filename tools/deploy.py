"""Create the work pools and queues that prefect.yaml names, then deploy every deployment in it.

    PREFECT_API_URL=http://127.0.0.1:4200/api python tools/deploy.py              # node queues node-0, node-1
    PREFECT_API_URL=... python tools/deploy.py --nodes 4 --name finetune/manual   # more queues, one deployment

`prefect deploy` refuses a work pool that does not exist yet, so this creates them first (process type, but
tandem-kubernetes: kubernetes type with deploy/kubernetes/pipeline-pool.json as its base job template; existing pools
and queues are left as they are), then runs `prefect --no-prompt deploy --all` (or `-n NAME`
for each --name) from the repository root.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
NODE_POOL = "tandem-nodes"  # the pool whose queues are node-0 .. node-{N-1} (launch.queue_prefix "node-")
# Pools of another type than process: (type, base job template).
TYPED_POOLS = {"tandem-kubernetes": ("kubernetes", ROOT / "deploy" / "kubernetes" / "pipeline-pool.json")}


def pools_and_queues(prefect_yaml: Path, nodes: int) -> dict[str, set[str]]:
    """Every work pool prefect.yaml names, with the queues its deployments and nodes need."""
    wanted: dict[str, set[str]] = {}
    for deployment in yaml.safe_load(prefect_yaml.read_text())["deployments"]:
        pool = deployment["work_pool"]
        wanted.setdefault(pool["name"], set()).add(pool.get("work_queue_name") or "default")
    if NODE_POOL in wanted:
        wanted[NODE_POOL] |= {f"node-{rank}" for rank in range(nodes)}
    return wanted


def ensure_pools(wanted: dict[str, set[str]]) -> None:
    """Create missing process pools and queues (idempotent)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client:
        for pool, queues in sorted(wanted.items()):
            with contextlib.suppress(ObjectAlreadyExists):
                client.create_work_pool(pool_create(pool))
            existing = {queue.name for queue in client.read_work_queues(work_pool_name=pool)}
            for queue in sorted(queues - existing):
                client.create_work_queue(name=queue, work_pool_name=pool)
            print(f"deploy: work pool {pool}: queues {', '.join(sorted(queues | existing))}")


def pool_create(pool: str) -> Any:
    """What creates a pool: process type, or the type and base job template of TYPED_POOLS."""
    from prefect.client.schemas.actions import WorkPoolCreate

    if pool not in TYPED_POOLS:
        return WorkPoolCreate(name=pool, type="process")
    kind, template = TYPED_POOLS[pool]
    return WorkPoolCreate(name=pool, type=kind, base_job_template=json.loads(template.read_text()))


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(
        prog="python tools/deploy.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=2, help="node queues to create in tandem-nodes (default 2)")
    parser.add_argument("--name", action="append", default=[], help="deploy only FLOW/NAME (repeatable)")
    args = parser.parse_args(argv)
    if args.nodes < 1:
        parser.error(f"--nodes must be >= 1, got {args.nodes}")
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():  # without it Prefect would deploy to a temporary server that then vanishes
        print(
            "error: PREFECT_API_URL is not set; point it at your server's API, e.g. "
            "export PREFECT_API_URL=http://127.0.0.1:4200/api (make cluster-up starts one)",
            file=sys.stderr,
        )
        return 2
    ensure_pools(pools_and_queues(ROOT / "prefect.yaml", args.nodes))
    selection = [option for name in args.name for option in ("-n", name)] or ["--all"]
    return subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", "deploy", *selection], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
