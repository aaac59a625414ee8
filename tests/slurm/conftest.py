"""A real one-node SLURM cluster on localhost for the session: munged, slurmctld and slurmd from Debian's
slurm-wlm/munge packages (`.ci/run` installs them), each with private files under a temporary directory
and their own ports. One machine hosts one SLURM node: Debian's slurmd is built without
--enable-multiple-slurmd, so multi-node allocations cannot be started here."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.command import free_port

CONF = """ClusterName=tandem-test
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
MinJobAge=600
NodeName=localhost NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory) -> Iterator[Path]:
    """Start munged, slurmctld and slurmd; sets SLURM_CONF for this process and its children."""
    missing = [tool for tool in ("munged", "slurmctld", "slurmd", "sbatch") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        pytest.skip(
            f"needs root and Debian's slurm-wlm + munge ({', '.join(missing) or 'not root'}); .ci/run installs them"
        )
    root = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (root / sub).mkdir()
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = root / "slurm.conf"
    conf.write_text(
        CONF.format(
            root=root, ctld_port=free_port(), d_port=free_port(), host=socket.gethostname(), cpus=os.cpu_count()
        )
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons = [
        subprocess.Popen(
            [
                "munged",
                "-F",
                "--force",
                f"--key-file={key}",
                f"--socket={root}/munge.socket",
                f"--pid-file={root}/munged.pid",
                f"--log-file={root}/munged.log",
                f"--seed-file={root}/munged.seed",
            ],
            env=env,
        )
    ]
    time.sleep(1)
    daemons.append(subprocess.Popen(["slurmctld", "-D", "-c", "-i"], env=env))
    time.sleep(2)
    daemons.append(subprocess.Popen(["slurmd", "-D", "-N", "localhost"], env=env))
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    try:
        deadline = time.monotonic() + 60
        while "idle" not in subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True).stdout:
            if time.monotonic() > deadline:
                raise RuntimeError(f"SLURM did not come up: {(root / 'slurmctld.log').read_text()[-2000:]}")
            time.sleep(1)
        yield root
    finally:
        for daemon in reversed(daemons):
            daemon.terminate()
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.kill()
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
