"""The ssh backend's description (launch/backends/ssh.py): for each host its check and its start over ssh, and the
JSON line the start writes to the bootstrap's stdin (its contract), with launch.forward_env's values masked and the
port node 0 picks shown as PORT. Hosts that run the commands are tests/netns."""

from __future__ import annotations

import json
import shlex

import pytest

from config.loader import load_config
from launch.backends.ssh import LINK_LOST_S, SshBackend
from launch.dry_run import planned_job
from launch.job import EVAL, TRAIN, PhaseJob

CANARY = "hf_canary_value_123"


def test_the_description_is_each_hosts_commands_and_what_its_node_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", CANARY)
    settings = ["run.storage=/shared/t", "run.name=r1", "launch.backend=ssh", "launch.hosts=[n0, 'n1:2222']"]
    cfg = load_config(None, [*settings, "launch.forward_env=[HF_TOKEN]", "launch.ssh_options=[-i, /k]"])
    job = PhaseJob(planned_job(cfg, TRAIN).written, TRAIN, env={"NCCL_DEBUG": "INFO"})
    text = SshBackend().describe(job)
    assert text.startswith("# launch.backend=ssh: 2 host(s)") and "PORT: a free port node 0 picks" in text
    assert CANARY not in text
    lines = text.splitlines()[1:]
    assert [lines[0], lines[4]] == ["# node 0 (n0)", "# node 1 (n1:2222)"]
    for rank, (check, start, sent) in enumerate([lines[1:4], lines[5:8]]):
        check_argv, start_argv = shlex.split(check), shlex.split(start)
        assert check_argv[0] == start_argv[0] == "ssh" and "BatchMode=yes" in check_argv and "-i" in start_argv
        assert ("-p" in start_argv) is (rank == 1) and start_argv[-2] == ["n0", "n1"][rank]
        assert "|| exit 91" in check_argv[-1] and ("s.getsockname()" in check_argv[-1]) is (rank == 0)
        assert start_argv[-1].endswith("-m launch.backends.ssh_bootstrap")
        request = json.loads(sent)
        spec = "/shared/t/runs/r1/spec.json"
        assert request["argv"] == ["--spec", spec, "--phase", "train", "--spec-digest", "SPEC-DIGEST"]
        assert (request["tag"], request["lost_s"]) == (f"LAUNCH-ID-{rank}", LINK_LOST_S)
        env = request["env"]
        assert (env["HF_TOKEN"], env["NCCL_DEBUG"], env["NODE_RANK"], env["MASTER_PORT"]) == (
            "***",
            "INFO",
            str(rank),
            "PORT",
        )
        assert env["MASTER_ADDR"] == "n0"  # the first host, unless launch.master_addr says otherwise


def test_a_configured_port_is_used_and_no_host_picks_one() -> None:
    cfg = load_config(None, ["launch.backend=ssh", "launch.hosts=[n0, n1]", "launch.master_port=6100"])
    text = SshBackend().describe(planned_job(cfg, EVAL))
    assert '"PORT"' not in text and "getsockname" not in text
    requests = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert [r["env"]["MASTER_PORT"] for r in requests] == ["6100", "6100"]
    assert requests[0]["argv"][-2:] == ["--model", f"{requests[0]['argv'][1].rsplit('/', 1)[0]}/MODEL"]
