"""launch.backend=ssh across real interfaces: nodes in network namespaces (tests/netns/hosts.py), each reached over
its own sshd, rendezvous and gloo collectives crossing the veths. This machine's hostname resolves to 127.0.0.1 in
every namespace, so a run only finishes when each node's ranks use the interface that routes to node 0."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from config.loader import load_config
from core.errors import RetryableError, UserError
from launch.job import TRAIN
from launch.phase import run_phase
from pipeline.plan import build_spec
from storage import layout
from storage.checkpoints import latest_complete, read_complete
from storage.location import Location, join
from storage.spec import WrittenSpec, write_spec
from tests.conftest import ROOT
from tests.distributed.harness import Staged, config
from tests.flows.test_orphans import start_phase
from tests.netns.hosts import Machine, Machines, _cmdline, heal, partition, restore, vanish

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
                    self.in_environment |= f"TANDEM_CANARY_TOKEN={SECRET}".encode() in environ


def test_the_pipeline_runs_over_ssh_across_namespaces(
    machines: Machines, prefect_server, tiny_model, tmp_path, monkeypatch
) -> None:
    from flows.finetune import finetune

    monkeypatch.setenv("TANDEM_CANARY_TOKEN", SECRET)  # a credential forwarded by name (launch.forward_env)
    cfg = load_config(
        None,
        [
            f"run.storage={tmp_path}",
            "run.name=over-ssh",
            f"model.name_or_path={tiny_model}",
            "launch.backend=ssh",
            f"launch.hosts=[{', '.join(machines.hosts(2))}]",
            f"launch.ssh_options=[{', '.join(machines.ssh_options)}]",
            "launch.nproc_per_node=1",
            "train.max_steps=4",
            "train.save_steps=2",
            "launch.rdzv_timeout=60",
            "launch.retries=1",
            "launch.retry_delay_s=0",
            "launch.forward_env=[TANDEM_CANARY_TOKEN]",
            f"launch.env={{TANDEM_TEST_EXIT_AT_STEP: '1:3', TANDEM_TEST_EXIT_ONCE: '{tmp_path / 'died-once'}'}}",
        ],
    )
    assert cfg.launch.nnodes == 2 and cfg.launch.rendezvous_addr == machines.machines[0].addr
    started = time.monotonic()
    with CommandLines(machines) as lines:
        summary = finetune(cfg)
    print(f"pipeline over ssh: {time.monotonic() - started:.1f} s")
    assert latest_complete(Location(summary["run_url"])).step == 4
    assert summary["registered"]
    # Rank 1 died once at step 3: the retry resumed over ssh, with the transport's own logging on.
    assert (tmp_path / "died-once").exists()
    log = (tmp_path / "runs" / "over-ssh" / "nodes" / "0" / "log.txt").read_text()
    assert "resumed from step 2" in log
    assert log.index("checkpoint step 2 complete") < log.index("[c10d] The debug level is set to DETAIL")
    # The forwarded credential reached the nodes without appearing on any command line there, or in preflight.json.
    assert lines.in_environment
    assert any("launch.backends.ssh_bootstrap" in line for line in lines.seen)
    assert not [line for line in lines.seen if SECRET in line]
    run = tmp_path / "runs" / "over-ssh"
    for rank in (0, 1):
        report = json.loads((run / "nodes" / str(rank) / "preflight.json").read_text())
        assert report["checks"]["interface"].startswith("eth0 (routes to 10.87.0.11;"), report
        assert "resolves to 127.0.0.1 (a loopback address" in report["checks"]["hostname"]
        assert report["checks"]["fabric"] == "no InfiniBand/RoCE device; NCCL uses TCP sockets"
        assert report["checks"]["forwarded environment"] == "TANDEM_CANARY_TOKEN set" and SECRET not in str(report)
        assert report["checks"]["gpus across nodes"] == "no GPU on every node (2)"
        probe = report["checks"]["bandwidth"]  # the probe before training, here on the retry's launch
        assert probe["ranks"] == 2 and probe["probe_mb"] == 4.0 and list(probe["nodes"]) == ["1"]
        assert min(probe["nodes"]["1"].values()) > 0.4 and probe["bus_gbps"] > 0.4, probe
        print(f"node {rank} probe:", json.dumps(probe))
    assert machines.strays() == {}


class ElasticPipeline:
    """`python -m flows.finetune` in a thread over 3 hosts with launch.min_nnodes=2 (8 steps, a checkpoint every 2,
    rank 0 slowed to 0.5 s a step so the run is mid-training when a host is lost), and what it ended with."""

    def __init__(self, machines: Machines, tiny_model: str, tmp_path: Path, name: str) -> None:
        from flows.finetune import finetune

        cfg = load_config(
            None,
            [
                f"run.storage={tmp_path}",
                f"run.name={name}",
                f"model.name_or_path={tiny_model}",
                "launch.backend=ssh",
                f"launch.hosts=[{', '.join(machines.hosts(3))}]",
                f"launch.ssh_options=[{', '.join(machines.ssh_options)}]",
                "launch.nproc_per_node=1",
                "launch.min_nnodes=2",
                "train.global_batch_size=24",
                "train.max_steps=8",
                "train.save_steps=2",
                "launch.rdzv_timeout=60",
                "launch.retries=1",
                "launch.retry_delay_s=0",
                "launch.ssh_connect_timeout=5",
                "launch.env={TANDEM_TEST_SLOW_RANK: '0:0.5'}",
            ],
        )
        self.run_dir = tmp_path / "runs" / name
        self.outcome: dict = {}

        def pipeline() -> None:
            try:
                self.outcome["summary"] = finetune(cfg)
            except Exception as exc:  # noqa: BLE001 - the test looks at it
                self.outcome["error"] = exc

        self.thread = threading.Thread(target=pipeline)
        self.thread.start()

    def attempts(self) -> list[dict]:
        return json.loads((self.run_dir / "spec.json").read_text())["attempts"]

    def wait_for_a_checkpoint(self) -> None:
        deadline = time.monotonic() + 180
        while (newest := latest_complete(Location(str(self.run_dir)))) is None or newest.step < 2:
            assert time.monotonic() < deadline and self.thread.is_alive(), self.outcome
            time.sleep(0.3)

    def assert_finished_without(self, lost: Machine) -> None:
        """Finished and registered on nodes 0 and 1 from a checkpoint of the 3-node attempt, `lost` left out."""
        self.thread.join(timeout=300)
        assert not self.thread.is_alive() and "error" not in self.outcome, self.outcome
        summary = self.outcome["summary"]
        assert latest_complete(Location(summary["run_url"])).step == 8 and summary["registered"]
        first, second = self.attempts()
        assert (first["nodes"], first["world_size"]) == ([0, 1, 2], 3)
        assert (second["nodes"], second["world_size"]) == ([0, 1], 2) and second["from_step"] >= 2
        assert list(second["left_out"]) == ["2"] and second["left_out"]["2"].startswith(f"node 2 ({lost.addr}): ")
        print("left out:", second["left_out"]["2"])
        assert f"resumed from step {second['from_step']}" in (self.run_dir / "nodes" / "0" / "log.txt").read_text()


def test_a_host_lost_for_good_the_run_finishes_on_the_others(
    machines: Machines, prefect_server, tiny_model, tmp_path
) -> None:
    """3 hosts, launch.min_nnodes=2: mid-training the third host vanishes (every process there, its sshd too). The
    retry probes the hosts over ssh, leaves the lost one out naming it, and finishes on the other two from the newest
    complete checkpoint (3 ranks' checkpoint resumed on 2, same global batch); nothing is left running anywhere."""
    run = ElasticPipeline(machines, tiny_model, tmp_path, "ssh-elastic")
    lost = machines.machines[2]
    try:
        run.wait_for_a_checkpoint()
        vanish(machines, lost)
        run.thread.join(timeout=300)
    finally:
        restore(machines, lost)
    run.assert_finished_without(lost)
    assert machines.strays() == {}


def test_a_host_cut_off_the_network_stops_itself_and_the_run_finishes_on_the_others(
    machines: Machines, prefect_server, tiny_model, tmp_path
) -> None:
    """As above, but the third host's link goes down: nothing refuses or resets, its packets are lost and its
    processes run on. The launcher gives up on its ssh connection, the retry leaves the host out and finishes on the
    other two; the cut-off host, no longer hearing from the launcher, stops its own node, so nothing of the run is
    left there even before the link comes back (without that, its rank would sit in a collective for
    launch.collective_timeout)."""
    run = ElasticPipeline(machines, tiny_model, tmp_path, "ssh-cut")
    cut = machines.machines[2]
    try:
        run.wait_for_a_checkpoint()
        partition(cut)
        cut_at = time.monotonic()
        while machines.strays().get(cut.namespace):
            assert time.monotonic() < cut_at + 120, machines.strays()
            time.sleep(0.3)
        print(f"link down -> nothing left on the cut-off host: {time.monotonic() - cut_at:.1f} s")
        while len(run.attempts()) < 2:
            assert time.monotonic() < cut_at + 120 and run.thread.is_alive(), run.outcome
            time.sleep(0.3)
        print(f"link down -> retry started: {time.monotonic() - cut_at:.1f} s")
        run.thread.join(timeout=300)
    finally:
        heal(cut)
    run.assert_finished_without(cut)
    assert machines.strays() == {}


def ssh_spec(staged: Staged, machines: Machines, name: str, hosts: list[str], overrides: list[str]) -> WrittenSpec:
    """A training spec for the ssh backend on these hosts (the session's staged data and model)."""
    cfg = config(
        staged,
        name,
        [
            "launch.backend=ssh",
            f"launch.hosts=[{', '.join(hosts)}]",
            f"launch.ssh_options=[{', '.join(machines.ssh_options)}]",
            *overrides,
        ],
    )
    spec = build_spec(cfg, name, staged.model_path, staged.dataset)
    return WrittenSpec(spec, join(spec.run, layout.SPEC), write_spec(spec))


def test_a_killed_node_fails_the_job_within_seconds_naming_its_host(staged: Staged, machines: Machines) -> None:
    written = ssh_spec(
        staged,
        machines,
        "ssh-kill",
        machines.hosts(2),
        ["train.max_steps=40", "launch.env={TANDEM_TEST_SLOW_RANK: '1:0.3'}"],
    )
    metrics = staged.storage / "runs" / "ssh-kill" / "metrics.jsonl"
    outcome: dict = {}

    def pipeline() -> None:
        try:
            run_phase(written, TRAIN, lambda _: None, on_progress=lambda _: None)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            outcome["error"], outcome["at"] = exc, time.monotonic()

    thread = threading.Thread(target=pipeline)
    thread.start()
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().strip()):
        assert time.monotonic() < deadline and thread.is_alive(), outcome
        time.sleep(0.2)
    victim = machines.machines[1]
    killed_at = time.monotonic()
    for pid in victim.pids():  # the whole node dies: everything in that namespace but its sshd
        if pid not in {p.pid for p in machines.sshd} and "sshd" not in _cmdline(pid).split(" ")[0]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    thread.join(timeout=60)
    assert not thread.is_alive()
    error = outcome["error"]
    print(f"node death -> pipeline failure: {outcome['at'] - killed_at:.1f} s")
    assert isinstance(error, RetryableError)
    assert str(error).startswith(f"train failed on node 1 ({victim.addr}): "), error
    assert outcome["at"] - killed_at < 20
    assert machines.strays() == {}


def test_an_ssh_refusal_is_one_line_naming_the_host_and_the_fix(staged: Staged, machines: Machines) -> None:
    hosts = [machines.machines[0].addr, f"nobody@{machines.machines[1].addr}"]
    written = ssh_spec(staged, machines, "ssh-refused", hosts, [])
    with pytest.raises(UserError) as refused:
        run_phase(written, TRAIN, lambda _: None)
    assert str(refused.value) == (
        f"node 1 (nobody@{machines.machines[1].addr}): Permission denied (publickey). — "
        "install this machine's key on it (ssh-copy-id), or name the key with "
        "launch.ssh_options=[-i, KEY]"
    )
    assert machines.strays() == {}


def test_duplicate_node_ranks_by_hand_stop_every_node_within_seconds(staged: Staged, machines: Machines) -> None:
    """The by-hand recipe of docs/launching.md over ssh, with NODE_RANK=1 given to two hosts of three."""
    cfg = config(staged, "by-hand-dup", ["launch.nnodes=3"])
    spec = build_spec(cfg, "by-hand-dup", staged.model_path, staged.dataset)
    write_spec(spec)
    spec_url = join(spec.run, layout.SPEC)
    first = machines.machines[0].addr
    nodes = []
    started = time.monotonic()
    for machine, rank in zip(machines.machines, (0, 1, 1), strict=True):
        command = (
            f"cd {ROOT} && NNODES=3 NODE_RANK={rank} MASTER_ADDR={first} MASTER_PORT=29411 "
            f"{sys.executable} -m launch.node --spec {spec_url}"
        )
        nodes.append(
            subprocess.Popen(
                ["ssh", *machines.ssh_options, "-o", "BatchMode=yes", machine.addr, command],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
        time.sleep(1.0)  # as a person would start them, one after the other
    outputs = [_output(node, 90) for node in nodes]
    elapsed = time.monotonic() - started
    print(f"duplicate NODE_RANK: every node stopped after {elapsed:.1f} s")
    print("\n---\n".join(outputs))
    assert [node.returncode for node in nodes] == [2, 2, 2], outputs
    names = {f"vm ({machines.machines[1].addr})", f"vm ({machines.machines[2].addr})"}
    duplicate = [line for line in outputs[2].splitlines() if line.startswith("error: ")]
    assert duplicate and "duplicate NODE_RANK=1: nodes on " in duplicate[0], outputs[2]
    assert all(name in duplicate[0] for name in names), duplicate
    for output in outputs[:2]:
        assert "duplicate NODE_RANK=1" in output, output
    assert elapsed < cfg.launch.rdzv_timeout
    assert machines.strays() == {}


def _output(process: subprocess.Popen, timeout_s: float) -> str:
    """The process's output once it exited, or what it printed before it was killed at the timeout."""
    try:
        return process.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        process.kill()
        return process.communicate()[0] + f"\n(still running after {timeout_s} s: killed)"


def test_a_cancelled_launch_leaves_nothing_running_on_any_host(staged: Staged, machines: Machines) -> None:
    """Ctrl-C (or a cancelled flow run) while the nodes train: every connection closes, every node stops."""
    written = ssh_spec(
        staged,
        machines,
        "ssh-cancel",
        machines.hosts(2),
        ["train.max_steps=40", "launch.env={TANDEM_TEST_SLOW_RANK: '1:0.3'}"],
    )

    def interrupt(_record: dict) -> None:
        raise KeyboardInterrupt

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_phase(written, TRAIN, lambda _: None, on_progress=interrupt)
    print(f"cancel: every host clean {time.monotonic() - started:.1f} s after the launch started")
    assert machines.strays() == {}
    assert not list(Path("/tmp").glob("tandem-ssh-*/*"))  # no shared connection left behind


def test_kill_9_of_the_pipeline_leaves_nothing_on_any_host(staged: Staged, machines: Machines) -> None:
    """The pipeline's process killed outright (the OOM killer, a lost terminal) while the nodes train over ssh: every
    host is clean within the bound of docs/operations.md (the ssh link's end, and the pipeline's liveness record),
    after the ranks saved on the way out, and the checkpoints are whole."""
    written = ssh_spec(
        staged,
        machines,
        "ssh-orphan",
        machines.hosts(2),
        ["train.max_steps=400", "train.save_steps=1000", "launch.checkpoint_on_cancel=true"],
    )
    run = staged.storage / "runs" / "ssh-orphan"
    pipeline = start_phase(str(written.url), run)
    pipeline.kill()
    pipeline.wait()
    killed = time.monotonic()
    while machines.strays():
        assert time.monotonic() - killed < 90, machines.strays()
        time.sleep(0.25)
    print(f"ssh backend: every host clean {time.monotonic() - killed:.1f} s after kill -9 of the pipeline")
    newest = latest_complete(Location(str(run)))
    assert newest is not None and newest.step >= 3, newest  # the ranks saved on the way out
    for step_dir in (run / "checkpoints").iterdir():
        assert not (step_dir / "COMPLETE").exists() or read_complete(Location(str(step_dir))) is not None
