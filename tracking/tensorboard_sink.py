"""The TensorBoard sink: scalar event files under {run}/tensorboard/, written by the pipeline process.

On a local (or NFS) storage root the events are written in place, so `tensorboard --logdir {storage}/runs` shows every
run. On an object store they are written to a local folder and uploaded under {run}/tensorboard/ when the run ends
(TensorBoard reads s3:// log directories itself with TensorFlow's file system; otherwise sync them down first).
TensorBoard is an optional extra (`pip install 'tandem[tensorboard]'`).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from storage import layout
from storage.fs import get_file, listdir, put_file
from storage.location import Location, is_local, join, local_path
from tracking.sink import RunInfo, require, step_metrics

EVENTS_PREFIX = "events.out.tfevents."


def import_tensorboard() -> None:
    """Fail with one line naming the extra when TensorBoard is missing."""
    require("tensorboard", "TensorBoard", "track.tensorboard", "false")


def last_event_step(logdir: Path) -> int:
    """The highest step of any scalar already written in `logdir` (0 when none)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    last = 0
    for path in sorted(logdir.glob(f"{EVENTS_PREFIX}*")):
        for event in EventFileLoader(str(path)).Load():
            if event.HasField("summary"):
                last = max(last, event.step)
    return last


class TensorBoardSink:
    """Scalars (train/*, eval/*) and text (params, tags) as TensorBoard events of one run."""

    name = "TensorBoard"

    def __init__(self) -> None:
        import_tensorboard()
        self.remote: Location | None = None
        self.logdir: Path | None = None
        self.writer: Any = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def open(self, run: RunInfo) -> int:
        """Open a new event file in {run}/tensorboard/ (events of earlier attempts stay beside it)."""
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        url = join(run.run_url, layout.TENSORBOARD)
        if is_local(url):
            self.logdir = Path(local_path(url))
            self.logdir.mkdir(parents=True, exist_ok=True)
        else:
            self._tmp = tempfile.TemporaryDirectory(prefix="tandem-tb-")
            self.logdir, self.remote = Path(self._tmp.name), url
            for name in listdir(url):
                if name.startswith(EVENTS_PREFIX):
                    get_file(join(url, name), str(self.logdir / name))
        last = last_event_step(self.logdir)
        self.writer = EventFileWriter(str(self.logdir))
        return last

    def _scalars(self, values: Mapping[str, float], step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=key, simple_value=value) for key, value in values.items()])
        self.writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))

    def _text(self, tag: str, text: str) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

        metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        tensor = TensorProto(dtype=7, string_val=[text.encode()], tensor_shape=TensorShapeProto())  # 7: DT_STRING
        summary = Summary(value=[Summary.Value(tag=tag, metadata=metadata, tensor=tensor)])
        self.writer.add_event(Event(wall_time=time.time(), step=0, summary=summary))

    def log_params(self, params: Mapping[str, str]) -> None:
        """The config as one markdown table (TensorBoard's Text tab)."""
        rows = "\n".join(f"| {key} | {value} |" for key, value in sorted(params.items()))
        self._text("config", f"| key | value |\n| --- | --- |\n{rows}")

    def log_steps(self, records: list[dict[str, Any]]) -> None:
        """train/* scalars at each step."""
        for record in records:
            self._scalars(step_metrics(record), record["step"])
        self.writer.flush()

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Scalars at one step."""
        self._scalars({key: float(value) for key, value in metrics.items()}, step)
        self.writer.flush()

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Tags as text (lineage)."""
        self._text("tags", "\n".join(f"- {key}: {value}" for key, value in sorted(tags.items())))

    def log_file(self, url: Location, name: str) -> None:
        """Files are not TensorBoard's business (they are beside it in the run directory)."""

    def close(self, status: str) -> None:
        """Flush and close the event file; on an object store, upload the folder."""
        self._text("status", status)
        self.writer.close()
        if self.remote is not None and self.logdir is not None:
            for name in os.listdir(self.logdir):
                put_file(str(self.logdir / name), join(self.remote, name))
            if self._tmp is not None:
                self._tmp.cleanup()
