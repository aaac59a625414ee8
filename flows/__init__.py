"""Prefect flows. Importing this package turns off Prefect's server analytics (there is no internet)."""

import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
