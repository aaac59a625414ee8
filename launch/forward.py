"""`launch.forward_env`: the credentials every node's agent and ranks need, forwarded by name.

The config holds only the names; the values are read from the environment of the process that starts a node, at
the moment it starts it, and travel by one channel per backend, never through a file, a command line or Prefect:

    local     the agent's process environment (this process's own)
    ssh       the SSH connection's stdin, read into the remote process's environment (not the remote command line)
    slurm     the job environment (sbatch --export=ALL from the pipeline's environment), never the sbatch script
    prefect   the node worker's own environment (start each node's worker with the variables set)

Every backend gets the names and values from `forward_env`; on every node, preflight reports each name as set or
missing (`forwarded_report`, never a value) and stops before training when one is missing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from config.sections.launch import LaunchConfig
from core.errors import UserError

SET, MISSING = "set", "missing"


def forward_env(launch: LaunchConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables launch.forward_env names that are set (non-empty) in `environ` (default: this process's
    environment), with their values: what a backend hands to the node it starts. Never log or store the result."""
    env = os.environ if environ is None else environ
    return {name: env[name] for name in launch.forward_env if env.get(name)}


def forwarded_report(launch: LaunchConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each forwarded name -> "set" or "missing" in `environ` (an empty value counts as missing)."""
    present = forward_env(launch, environ)
    return {name: SET if name in present else MISSING for name in launch.forward_env}


def check_forwarded(launch: LaunchConfig, node_rank: int, host: str, environ: Mapping[str, str] | None = None) -> str:
    """Preflight: every forwarded name is set on this node; the report line, or a UserError naming the missing."""
    report = forwarded_report(launch, environ)
    missing = [name for name, state in report.items() if state == MISSING]
    if missing:
        raise UserError(
            f"node {node_rank} ({host}): launch.forward_env names {', '.join(missing)}, not set on this node; set it "
            "in the environment that starts the node (the pipeline's shell for the local, slurm and ssh backends, "
            "the node's worker for prefect) or remove the name from launch.forward_env"
        )
    return ", ".join(f"{name} {state}" for name, state in report.items()) or "(launch.forward_env empty)"
