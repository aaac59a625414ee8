"""launch.backend=ssh across real interfaces: nodes in network namespaces (tests/netns/hosts.py), each reached over
its own sshd, rendezvous and gloo collectives crossing the veths. This machine's hostname resolves to 127.0.0.1 in
every namespace, so a run only finishes when each node's ranks use the interface that routes to node 0."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from config.loader import load_config
from storage.checkpoints import latest_complete
from tests.netns.hosts import Machines, _cmdline

pytestmark = pytest.mark.netns
SECRET = "forwarded-not-on-a-command-line"


class CommandLines:
    """Every command line seen in the namespaces while a run goes on, and whether SECRET reached a node's
    environment (polled from /proc: what `ps` shows on those hosts)."""

    def __init__(self, machines: Machines) -> None:
        self.machines, self.seen, self.in_environment = machines, set(), False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> CommandLines:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(0.3):
            for machine in self.machines.machines:
                for pid in machine.pids():
                    self.seen.add(_cmdline(pid))
                    try:
                        environ = Path(f"/proc/{pid}/environ").read_bytes()
                    except OSError:
                        continue
                    self.in_environment |= f"TANDEM_TEST_MARK={SECRET}".encode() in environ


def test_the_pipeline_runs_over_ssh_across_namespaces(machines: Machines, prefect_server, tiny_model, tmp_path) -> None:
    from flows.finetune import finetune

    cfg = load_config(None, [
        f"run.storage={tmp_path}", "run.name=over-ssh", f"model.name_or_path={tiny_model}", "launch.backend=ssh",
        f"launch.hosts=[{', '.join(machines.hosts(2))}]", f"launch.ssh_options=[{', '.join(machines.ssh_options)}]",
        "launch.nproc_per_node=1", "train.max_steps=4", "train.save_steps=2", "launch.rdzv_timeout=60",
        f"launch.env={{TANDEM_TEST_MARK: {SECRET}}}"])
    assert cfg.launch.nnodes == 2 and cfg.launch.rendezvous_addr == machines.machines[0].addr
    started = time.monotonic()
    with CommandLines(machines) as lines:
        summary = finetune(cfg)
    print(f"pipeline over ssh: {time.monotonic() - started:.1f} s")
    assert latest_complete(summary["run_url"]).step == 4
    assert summary["registered"]
    # The run's environment reached the nodes without appearing on any command line there.
    assert lines.in_environment
    assert any("launch.ssh_bootstrap" in line for line in lines.seen)
    assert not [line for line in lines.seen if SECRET in line]
    run = tmp_path / "runs" / "over-ssh"
    for rank in (0, 1):
        report = json.loads((run / "nodes" / str(rank) / "preflight.json").read_text())
        assert report["checks"]["interface"].startswith("eth0 (routes to 10.87.0.11;"), report
        assert "resolves to 127.0.0.1 (a loopback address" in report["checks"]["hostname"]
        assert report["checks"]["fabric"] == "no InfiniBand/RoCE device; NCCL uses TCP sockets"
    assert machines.strays() == {}
