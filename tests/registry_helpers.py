"""The registry tests' entries, and the functions they run in racing processes (importable by spawned children)."""

from __future__ import annotations

from typing import Any

from storage.location import Location
from storage.registry import promote, read_entry, register_version

LINEAGE = {
    "dataset_id": "ds-0",
    "dataset_manifest_digest": "d",
    "spec_digest": "s",
    "code_version": "c",
    "checkpoint_manifest_digest": "k",
    "flow_run_id": None,
    "nnodes": 1,
    "world_size": 1,
}


def entry(loss: float, writer: str) -> dict[str, Any]:
    """A registry entry body whose metrics and writer are recognizable."""
    import math

    return {
        "metrics": {
            "loss": loss,
            "perplexity": math.exp(loss),
            "token_accuracy": 0.5,
            "target_tokens": 10,
            "correct_tokens": 5,
            "examples": 2,
        },
        "model_url": f"/models/{writer}",
        "checkpoint_url": f"/ckpt/{writer}",
        "base_model": "/base",
        "method": "lora",
        "writer": writer,
        "lineage": LINEAGE,
    }


def claim(storage: Location, model: str, loss: float, writer: str) -> int:
    """Register one version (in a child process); returns the version it got."""
    from storage.registry import register_version

    version, _ = register_version(storage, model, entry(loss, writer))
    return version


def claim_and_promote(storage: Location, model: str, loss: float, writer: str) -> int:
    """Register and try to become champion by loss, as the register task does."""
    from storage.registry import promote, read_entry

    version = claim(storage, model, loss, writer)
    promote(storage, model, version, read_entry(storage, model, version)["metrics"], "loss", "min")
    return version


def registered(storage: str, *losses: float) -> None:
    """Register one version per loss, promoting by loss as the register task does without a gate."""
    for i, loss in enumerate(losses):
        version, _ = register_version(storage, "m", entry(loss, f"w{i}"))
        promote(storage, "m", version, read_entry(storage, "m", version)["metrics"], "loss", "min")
