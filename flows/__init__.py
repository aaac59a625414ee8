"""Prefect flows. Importing this package sets two Prefect defaults a user can still override in the environment.

- Server analytics off: there may be no internet, and a run should not try to reach it.
- A 120 s start-up allowance for the temporary local server that `python -m flows.…` starts when no
  PREFECT_API_URL is set: Prefect's default of 20 s is not enough on a loaded 2-core machine (its database
  migrations alone can take that long), and the run then dies with "Timed out while attempting to connect to
  ephemeral Prefect API server" before doing anything.
"""

import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
