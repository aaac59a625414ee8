"""How the run reaches its nodes: the `launch` section (backend, node shape, rendezvous, retries, stalls, the
ranks' environment and the credentials forwarded by name, the network probe) and `resolve_ssh_hosts`, which lets the
`ssh` backend's hosts or host file decide the node count.

Parsing only, like config/hosts.py, which it uses: nothing here connects to a host.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from config.hosts import parse_host, read_hostfile
from config.sections.base import ENV_FIX, Section, refuse_secrets
from config.sections.kubernetes import KubernetesConfig

# What launch.forward_env accepts: a POSIX environment variable name.
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class LaunchConfig(Section):
    """How torchrun reaches every node."""

    backend: Literal["local", "prefect", "slurm", "ssh", "kubernetes"] = Field(
        "local",
        description="local: every node is a torchrun agent on this machine; prefect: one node flow run per node, "
        "on work queue {queue_prefix}{rank}, served by a process worker on that node; slurm: one sbatch job; "
        "ssh: `python -m launch.node` on every host of launch.hosts / launch.hostfile over OpenSSH; kubernetes: one "
        "pod per node, a Kubeflow Trainer TrainJob or an indexed Job (launch.kubernetes).",
    )
    queue_prefix: str = Field("node-", min_length=1, description="prefect backend: node r's work queue is prefix + r.")
    node_deployment: str = Field("node/node", min_length=3, description="prefect backend: the per-node deployment.")
    slurm_args: list[str] = Field(
        default_factory=list, description="slurm backend: extra #SBATCH options, e.g. --partition=gpu, --time=24:00:00."
    )
    kubernetes: KubernetesConfig = Field(
        default_factory=KubernetesConfig, description="kubernetes backend: the pods (docs/kubernetes.md)."
    )
    nnodes: int = Field(2, gt=0, le=1024, description="Number of nodes.")
    min_nnodes: int | None = Field(
        None,
        gt=0,
        le=1024,
        description="local, ssh and kubernetes backends: a retry after a lost node continues on the nodes "
        "that pass preflight (ssh: the hosts of launch.hosts that answer; kubernetes: the pods the cluster schedules "
        "within launch.kubernetes.schedule_timeout_s, at once, not as a retry) when at least this many do (from the "
        "newest complete checkpoint, same train.global_batch_size); empty: launch.nnodes (every node must come back).",
    )
    max_nnodes: int | None = Field(
        None,
        gt=0,
        le=1024,
        description="Upper bound of the nodes a retry may use (local and kubernetes backends: nodes it may add "
        "when more are free; ssh: the hosts of launch.hosts); empty: launch.nnodes.",
    )
    nproc_per_node: int = Field(1, gt=0, le=64, description="Ranks per node (GPUs per node).")
    hosts: list[str] = Field(
        default_factory=list,
        description="ssh backend: the nodes, node 0 first: host, user@host or host:port "
        "(ssh's port). They decide launch.nnodes.",
    )
    hostfile: str | None = Field(
        None,
        description="ssh backend, when launch.hosts is empty: a file of hosts, `host slots=N` per line "
        "(DeepSpeed/OpenMPI) or one line per slot (a PBS/Torque node file: $PBS_NODEFILE); it decides launch.nnodes "
        "and launch.nproc_per_node. The hosts read are recorded in launch.hosts.",
    )
    remote_root: str | None = Field(
        None, description="ssh backend: the Tandem checkout on the hosts; empty: the same path as on this machine."
    )
    remote_python: str | None = Field(
        None, description="ssh backend: the Python on the hosts; empty: the same path as this process's."
    )
    ssh_options: list[str] = Field(
        default_factory=list,
        description="ssh backend: extra ssh options, e.g. -i ~/.ssh/cluster or "
        "-oProxyJump=bastion (BatchMode, a connect timeout and connection sharing are always set).",
    )
    ssh_connect_timeout: int = Field(10, gt=0, le=300, description="ssh backend: seconds to connect to a host.")
    master_addr: str | None = Field(
        None,
        min_length=1,
        description="Rendezvous host (node 0's address); empty: the first of launch.hosts "
        "(ssh backend), else 127.0.0.1.",
    )
    master_port: int | None = Field(
        None, ge=1024, le=65535, description="Rendezvous port; empty: a free port is picked per launch."
    )
    node_cache_dir: str | None = Field(
        None,
        min_length=1,
        description="A directory on each node's own disk where it keeps what it can reuse across launches and runs "
        "(the digests of the base model's and the dataset's files; a copy of a dataset staged on an object store, or "
        "in the earlier Parquet form, that the node's ranks read); empty: $TANDEM_NODE_CACHE, else ~/.cache/tandem.",
    )
    node_cache_max_gb: float = Field(
        100.0,
        gt=0,
        description="The most the node cache's dataset copies may hold on a node, in GB (1e9 bytes): beyond it the "
        "least recently used copies not in use are removed before another is fetched; a dataset larger than this "
        "stops preflight with a line saying to raise it.",
    )
    rdzv_timeout: int = Field(120, gt=0, description="Seconds to wait for every node to join.")
    collective_timeout: int = Field(
        1800,
        gt=0,
        description="Seconds a rank may wait in one collective (all-reduce, barrier) before the job "
        "fails. Must exceed the longest checkpoint save, during which the other ranks wait at a barrier; "
        "hangs are caught sooner by launch.stall_timeout, lost nodes within seconds by the agents.",
    )
    retries: int = Field(
        0,
        ge=0,
        le=20,
        description="Retry training this many times after a retryable failure (lost node, stall, "
        "rendezvous timeout); each retry resumes from the newest complete checkpoint. Bad config/data is not retried.",
    )
    retry_delay_s: int = Field(10, ge=0, description="Seconds between a failure and its retry.")
    checkpoint_on_cancel: bool = Field(
        False, description="When the run is cancelled, save a checkpoint at the next step boundary before stopping."
    )
    cancel_grace_s: int = Field(
        30,
        ge=1,
        le=3600,
        description="Seconds ranks get to stop (and save) after a cancel before they are "
        "killed (torchrun itself kills its ranks 30 s after forwarding the signal).",
    )
    stall_timeout: int = Field(
        600,
        gt=0,
        description="Stop the job when no optimizer step completes for this many seconds (a step "
        "that saves a checkpoint includes the save: keep it above the longest save).",
    )
    api_outage_s: int = Field(
        1800,
        gt=0,
        description="How long the pipeline waits for a Prefect API that stopped answering while the nodes run "
        "(they train on without it, followed through their records on storage) before it fails the phase with "
        "exit 75.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment for every rank (NCCL_*, GLOO_*), stored with the run; "
        "no credentials (see forward_env).",
    )
    forward_env: list[str] = Field(
        default_factory=list,
        description="Names of environment variables (credentials: HF_TOKEN, "
        "AWS_SECRET_ACCESS_KEY, ...) every node's agent and ranks get from the environment that starts the node; "
        "values never enter the config. Preflight fails on a node where one is not set.",
    )

    @field_validator("env", mode="before")
    @classmethod
    def _no_credentials(cls, value: object) -> object:
        return refuse_secrets(value, "launch.env", ENV_FIX)

    @field_validator("forward_env")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        bad = [name for name in names if not re.match(ENV_NAME, name)]
        if bad:
            raise ValueError(
                f"launch.forward_env: {bad[0]!r} is not an environment variable name (letters, digits, "
                "_; not starting with a digit)"
            )
        if twice := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(f"launch.forward_env: {twice[0]} is listed twice")
        return names

    @model_validator(mode="after")
    def _env_or_forwarded(self) -> LaunchConfig:
        if both := sorted(set(self.env) & set(self.forward_env)):
            raise ValueError(f"launch.env.{both[0]} is also in launch.forward_env; keep it in one place")
        return self

    @model_validator(mode="after")
    def _kubernetes_needs(self) -> LaunchConfig:
        if self.backend != "kubernetes":
            return self
        if self.kubernetes.image is None:
            raise ValueError(
                "launch.backend=kubernetes needs launch.kubernetes.image: the image every node's pod runs "
                "(docker/train.Dockerfile builds one; push it where the cluster pulls from)"
            )
        if self.forward_env and self.kubernetes.secret is None:
            raise ValueError(
                "launch.forward_env with launch.backend=kubernetes needs launch.kubernetes.secret: a Secret in "
                f"launch.kubernetes.namespace with the keys {', '.join(self.forward_env)} (the pods read each value "
                "from it; no value goes into a manifest)"
            )
        return self

    probe_mb: float = Field(
        4.0,
        ge=0,
        le=1024,
        description="Megabytes of the network probe before training (an all-reduce over every "
        "rank and a send/receive between each node and node 0, both ways); 0 turns it off.",
    )
    min_bandwidth_gbps: float = Field(
        1.0,
        ge=0,
        description="Warn (or fail, with launch.require_bandwidth) when the probe measures less than "
        "this many Gbit/s (Qwen's guide asks for 10+ between GPU nodes).",
    )
    require_bandwidth: bool = Field(
        False, description="Fail before training when the probe measures less than launch.min_bandwidth_gbps."
    )
    require_space: bool = Field(
        True,
        description="Fail before training when run.storage or a node's local disk has less free space than the run "
        "will write there (the estimate of docs/operations.md: (train.keep_latest_k + 1) checkpoints, or every save, "
        "plus the export and merged export; a rank's staged shard and the dataset copy on the node); false: report "
        "the shortfall as a warning and train anyway.",
    )

    require_fit: bool = Field(
        True,
        description="Fail before any rank loads when the run's memory plan (docs/memory-plan.md) does not fit a "
        "node: one rank's device peak against the least free GPU's memory, the node's ranks' host peak against "
        "MemAvailable; only beyond the plan's stated error (25%); false: report it as a warning and train anyway.",
    )

    @model_validator(mode="before")
    @classmethod
    def _hosts_decide_the_shape(cls, data: object) -> object:
        """With the ssh backend the hosts decide nnodes (and, from a host file, nproc_per_node)."""
        if not isinstance(data, dict) or data.get("backend") != "ssh":
            return data
        return resolve_ssh_hosts(dict(data))

    @property
    def rendezvous_addr(self) -> str:
        """Where node 0's rendezvous listens: launch.master_addr, else the first host (ssh), else 127.0.0.1."""
        if self.master_addr:
            return self.master_addr
        if self.backend == "ssh" and self.hosts:
            return parse_host(self.hosts[0], "launch.hosts[0]").host
        return "127.0.0.1"


def resolve_ssh_hosts(data: dict) -> dict:
    """Fill nnodes / nproc_per_node / hosts of an ssh launch section from launch.hosts or launch.hostfile; a value
    set explicitly that contradicts the hosts is an error naming both."""
    hosts = data.get("hosts") or []
    if isinstance(hosts, str):
        hosts = [h for h in hosts.replace(",", " ").split() if h]
    if hosts:
        parsed = [parse_host(str(h), f"launch.hosts[{i}]") for i, h in enumerate(hosts)]
        slots = None
    elif data.get("hostfile"):
        found = read_hostfile(str(data["hostfile"]))
        parsed = [host for host, _ in found]
        if len({n for _, n in found}) > 1:
            raise ValueError(
                f"launch.hostfile {data['hostfile']}: hosts have different slot counts "
                f"({', '.join(f'{h} slots={n}' for h, n in found)}); every node runs the same number "
                "of ranks: give each host the same slots"
            )
        slots = found[0][1]
    else:
        raise ValueError(
            "launch.backend=ssh needs launch.hosts (host, user@host or host:port, node 0 first) or "
            "launch.hostfile (e.g. $PBS_NODEFILE)"
        )
    if len({h.host for h in parsed}) < len(parsed):
        raise ValueError(f"launch.hosts lists a host twice ({', '.join(map(str, parsed))}); one entry per node")
    names = ", ".join(map(str, parsed))
    if "nnodes" in data and int(data["nnodes"]) != len(parsed):
        raise ValueError(
            f"launch.nnodes={data['nnodes']} contradicts the {len(parsed)} ssh hosts ({names}); "
            "drop launch.nnodes (the hosts decide it) or fix the hosts"
        )
    if slots is not None and "nproc_per_node" in data and int(data["nproc_per_node"]) != slots:
        raise ValueError(
            f"launch.nproc_per_node={data['nproc_per_node']} contradicts launch.hostfile "
            f"(slots={slots} per host); drop launch.nproc_per_node or fix the host file"
        )
    data["hosts"] = [str(h) for h in parsed]
    data["nnodes"] = len(parsed)
    if slots is not None:
        data["nproc_per_node"] = slots
    return data
