"""The registered model as a Prefect asset materialization, with the staged dataset as its upstream asset.

Asset keys are the storage URLs (file:///… for local paths, s3://… as they are), so the lineage graph
in Prefect's UI names the same objects as the registry entry.
"""

from __future__ import annotations

import re

from prefect import get_run_logger
from prefect.assets import Asset, AssetProperties, add_asset_metadata, materialize

from core.redact import redact
from pipeline.lineage import browser_link
from storage.location import Location
from storage.spec import Spec
from tasks.register import Registration

# Characters Prefect refuses in asset keys (prefect.types.names.RESTRICTED_ASSET_CHARACTERS).
_RESTRICTED = re.compile(r"[\s#?&%\"'<>\[\]{}|\\^`\x00]")


def asset_key(url: Location) -> str:
    """A Prefect asset key for a storage URL."""
    return _RESTRICTED.sub("_", browser_link(url))


def model_asset(spec: Spec, registered: Registration) -> Asset:
    """The registered model (its exported directory, under the run), named by registry version."""
    name = registered.message.removesuffix(" (champion)")
    return Asset(
        key=asset_key(spec.run.with_url(registered.entry["model_url"])),
        properties=AssetProperties(
            name=name, description=f"{registered.entry['method']} model, registry entry {registered.url}"
        ),
    )


def dataset_asset(spec: Spec) -> Asset:
    """The staged, tokenized dataset the model was trained and evaluated on."""
    return Asset(
        key=asset_key(spec.dataset_dir),
        properties=AssetProperties(name=spec.dataset.dataset_id, description=f"staged from {spec.config.data.source}"),
    )


def record_model_asset(spec: Spec, registered: Registration) -> str:
    """Run a materializing task for the model (upstream: the dataset); returns the model's asset key."""
    model, dataset = model_asset(spec, registered), dataset_asset(spec)

    @materialize(model, asset_deps=[dataset], name="materialize-model", by="tandem")
    def materialize_model() -> str:
        entry = registered.entry
        add_asset_metadata(
            model,
            redact(
                {
                    "version": registered.version,
                    "registry_url": registered.url,
                    "metrics": entry["metrics"],
                    "lineage": entry["lineage"],
                }
            ),
        )
        get_run_logger().info("asset %s materialized from %s", model.key, dataset.key)
        return model.key

    return materialize_model()
