"""The trainer: what every rank runs (`python -m trainer`, `-m trainer.evaluate`, `-m trainer.watch.probe`)."""

import os

from storage.layout import RANK_PROCESS_ENV
from trainer.model.lean_imports import skip_tracking_libraries

# A rank's entry module imports DeepSpeed at its top (DeepSpeed imports MLflow whenever it is installed), before any
# of its code could run: the package's import is the one point every rank passes first. The launcher sets the
# variable in its ranks' environment only (launch/command.py); the pipeline's own process tracks with MLflow.
if os.environ.get(RANK_PROCESS_ENV) == "1":
    skip_tracking_libraries()
