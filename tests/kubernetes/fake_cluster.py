"""A stand-in for a Kubernetes cluster, for the one part that cannot run here (no API server, no container runtime):
an HTTP server on 127.0.0.1 that answers the official client's calls the `kubernetes` backend makes, and a "kubelet"
that runs each pod's container as a local process, exactly as rendered: its command, working directory and
environment, with what the cluster would inject (an indexed Job's completion index through the downward API, a
TrainJob's PET_* variables as Kubeflow Trainer's torch plugin sets them, a Secret's values through secretKeyRef), and
the pod's DNS names in an /etc/hosts of its own (a mount namespace per pod, as the kubelet writes a pod's hosts file).
Every pod also gets what the kubelet gives any pod: its service account's token, CA and namespace mounted at
/var/run/secrets/kubernetes.io/serviceaccount, KUBERNETES_SERVICE_HOST/PORT naming the API server (HTTPS, with a
certificate of its own), and HOSTNAME, its name; so a pipeline in a pod finds the cluster as in a real one. A
container without a command runs the image's entrypoint with its args; the image is this checkout as
docker/train.Dockerfile lays it out (its entrypoint, its Python first on PATH, TANDEM_ROOT).

Scheduling is one number, `capacity` (the nodes with room for a pod; None: room for all): a pod past it stays Pending
with the scheduler's Unschedulable condition, and a job under a Kueue queue label gets pods only when all of them
fit (Kueue's gang admission), else none. What it does not do: pull images, enforce resources, reschedule a pending
pod, run controllers beyond these two objects' pods. Tests say which part is real: the pods' processes (launch.node,
torchrun, the ranks), storage, the pipeline and the client.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from core.checkout import PROJECT_ROOT

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# What Kubeflow Trainer's torch plugin uses when the TrainJob names no port.
TRAINER_PORT = 29400
# The host environment a pod's process starts from (an image has its own PATH and HOME; nothing else leaks in).
BASE_ENV = ("PATH", "HOME", "LANG", "TMPDIR")
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")  # where the kubelet mounts a pod's account
ENTRYPOINT = PROJECT_ROOT / "docker" / "entrypoint.sh"  # docker/train.Dockerfile's ENTRYPOINT


@dataclass
class Pod:
    name: str
    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]
    spec: dict[str, Any]
    log: Path
    phase: str = "Pending"
    process: subprocess.Popen | None = None
    waiting: dict[str, str] | None = None
    exit_code: int | None = None
    conditions: list[dict[str, str]] = field(default_factory=list)
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))

    def to_json(self) -> dict[str, Any]:
        container = self.spec["containers"][0]
        if self.waiting is not None:
            state: dict[str, Any] = {"waiting": self.waiting}
        elif self.exit_code is not None:
            state = {
                "terminated": {"exitCode": self.exit_code, "reason": "Completed" if self.exit_code == 0 else "Error"}
            }
        elif self.process is not None:
            state = {"running": {}}
        else:
            state = {"waiting": {"reason": "ContainerCreating"}}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "uid": self.uid,
                "labels": self.labels,
                "annotations": self.annotations,
            },
            "spec": self.spec,
            "status": {
                "phase": self.phase,
                "conditions": self.conditions,
                "containerStatuses": [{"name": container["name"], "image": container.get("image"), "state": state}],
            },
        }


@dataclass
class FakeCluster:
    """The API server's state and the kubelet's processes. `secrets`: (namespace, name) -> data, set by the test."""

    root: Path
    secrets: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, Pod] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    received: list[dict[str, Any]] = field(default_factory=list)  # every object the client sent
    unpullable: set[str] = field(default_factory=set)
    capacity: int | None = None  # how many pods the cluster's nodes have room for (None: all)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    # -- the kubelet -----------------------------------------------------------------------------------------------
    def start_pods(self, kind: str, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        name, namespace = meta["name"], meta["namespace"]
        wanted = body["spec"].get("completions", 1) if kind == "Job" else body["spec"]["trainer"]["numNodes"]
        if QUEUE_LABEL in meta.get("labels", {}) and not self.room(wanted):
            return  # Kueue keeps the job suspended until all of its pods fit: no pod at all
        if kind == "Job":
            template = body["spec"]["template"]
            subdomain = template["spec"].get("subdomain")
            hosts = [f"{name}-{i}.{subdomain}.{namespace}.svc" for i in range(wanted)] if subdomain else []
            for index in range(wanted):
                pod = Pod(
                    f"{name}-{index}-x{index}",
                    namespace,
                    {**template["metadata"].get("labels", {}), COMPLETION_INDEX: str(index)},
                    {**template["metadata"].get("annotations", {}), COMPLETION_INDEX: str(index)},
                    template["spec"],
                    self.root / f"{name}-{index}.log",
                )
                self._run(pod, {}, hosts)
        else:  # a TrainJob: the runtime's `node` job, one pod per node, PET_* injected
            trainer = body["spec"]["trainer"]
            patch = body["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
            pod_patch = patch["template"]["spec"]["template"]
            container = {
                "name": "node",
                "image": trainer["image"],
                "command": trainer["command"],
                "env": trainer.get("env", []),
                **{k: v for k, v in pod_patch["spec"]["containers"][0].items() if k != "name"},
            }
            spec = {**{k: v for k, v in pod_patch["spec"].items() if k != "containers"}, "containers": [container]}
            master = f"{name}-node-0-0.{name}"
            for index in range(trainer["numNodes"]):
                pod = Pod(
                    f"{name}-node-0-{index}-x{index}",
                    namespace,
                    {JOBSET_LABEL: name},
                    {**pod_patch["metadata"].get("annotations", {}), COMPLETION_INDEX: str(index)},
                    spec,
                    self.root / f"{name}-{index}.log",
                )
                injected = {
                    "PET_NNODES": str(trainer["numNodes"]),
                    "PET_NPROC_PER_NODE": str(trainer.get("numProcPerNode", "auto")),
                    "PET_NODE_RANK": str(index),
                    "PET_MASTER_ADDR": master,
                    "PET_MASTER_PORT": str(TRAINER_PORT),
                }
                self._run(pod, injected, [master])

    def room(self, pods: int) -> bool:
        placed = sum(1 for pod in self.pods.values() if not pod.conditions)
        return self.capacity is None or placed + pods <= self.capacity

    def _run(self, pod: Pod, injected: dict[str, str], hosts: list[str]) -> None:
        if not self.room(1):
            pod.conditions = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": f"0/{self.capacity} nodes are available: {self.capacity} Insufficient nvidia.com/gpu",
                }
            ]
            self.pods[pod.name] = pod
            return
        self.pods[pod.name] = pod
        container = pod.spec["containers"][0]
        if container.get("image") in self.unpullable:
            pod.waiting = {"reason": "ErrImagePull", "message": f"pull access denied for {container['image']}"}
            return
        env = {name: os.environ[name] for name in BASE_ENV if name in os.environ}
        env.update(self.image_env())
        env.update(KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT=self.url.rsplit(":", 1)[1])
        env.update(HOSTNAME=pod.name, **injected)
        for item in container.get("env", []):
            value = self._value(pod, item)
            if value is None:
                pod.waiting = {
                    "reason": "CreateContainerConfigError",
                    "message": f"couldn't find key {item['valueFrom']['secretKeyRef']['key']} in Secret",
                }
                return
            env[item["name"]] = value
        hosts_file = self.root / f"{pod.name}.hosts"
        hosts_file.write_text(
            "127.0.0.1 localhost\n" + "".join(f"127.0.0.1 {host}\n" for host in hosts), encoding="utf-8"
        )
        account = self.service_account(pod.namespace)
        argv = container.get("command") or [str(ENTRYPOINT)]  # no command: the image's ENTRYPOINT, then args
        command = [
            "unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount --bind "$0" /etc/hosts && mount --bind "$1" "$2" && shift 2 && exec "$@"',
            str(hosts_file), str(account), str(SERVICE_ACCOUNT), *argv, *container.get("args", []),
        ]  # fmt: skip
        with open(pod.log, "wb") as log:
            # Without a workingDir the image's WORKDIR applies; "/" here, so that only what was rendered finds Tandem.
            pod.process = subprocess.Popen(
                command,
                cwd=container.get("workingDir", "/"),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        pod.phase = "Running"
        threading.Thread(target=self._wait, args=(pod,), daemon=True).start()

    def image_env(self) -> dict[str, str]:
        """What docker/train.Dockerfile's ENV sets: its venv first on PATH, the checkout as TANDEM_ROOT."""
        path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        return {"PATH": path, "TANDEM_ROOT": str(PROJECT_ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}

    def service_account(self, namespace: str) -> Path:
        """The directory mounted at SERVICE_ACCOUNT in the namespace's pods: a token, the API server's CA, the
        namespace."""
        account = self.root / f"serviceaccount-{namespace}"
        if not account.is_dir():
            account.mkdir()
            (account / "token").write_text("not-a-secret")
            (account / "ca.crt").write_bytes((self.root / "cert.pem").read_bytes())
            (account / "namespace").write_text(namespace)
        return account

    def _value(self, pod: Pod, item: dict[str, Any]) -> str | None:
        if "value" in item:
            return str(item["value"])
        source = item["valueFrom"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            key = path[len("metadata.annotations['") : -2]
            return pod.annotations[key]
        ref = source["secretKeyRef"]
        return self.secrets.get((pod.namespace, ref["name"]), {}).get(ref["key"])

    def _wait(self, pod: Pod) -> None:
        assert pod.process is not None
        code = pod.process.wait()
        with self.lock:
            pod.exit_code = code if code >= 0 else 128 - code
            pod.phase = "Succeeded" if code == 0 else "Failed"

    def stop_pods(self, selector: tuple[str, str]) -> None:
        """Foreground deletion: SIGTERM, the pod's grace, then SIGKILL, as the kubelet does; returns when all ended."""
        key, value = selector
        for pod in [p for p in self.pods.values() if p.labels.get(key) == value]:
            if pod.process is not None and pod.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pod.process.pid, signal.SIGTERM)
                try:
                    pod.process.wait(timeout=pod.spec.get("terminationGracePeriodSeconds", 30))
                except subprocess.TimeoutExpired:
                    os.killpg(pod.process.pid, signal.SIGKILL)
                    pod.process.wait()
            del self.pods[pod.name]

    def alive(self) -> list[str]:
        return [pod.name for pod in self.pods.values() if pod.process is not None and pod.process.poll() is None]

    def shutdown(self) -> None:
        for pod in list(self.pods.values()):
            if pod.process is not None and pod.process.poll() is None:
                os.killpg(pod.process.pid, signal.SIGKILL)
                pod.process.wait()

    # -- the API server --------------------------------------------------------------------------------------------
    def status_of(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        """A Job's (or TrainJob's) conditions from its pods: Complete when all succeeded, Failed when one failed."""
        label = (
            (JOBSET_LABEL, body["metadata"]["name"])
            if kind == "TrainJob"
            else ("tandem.dev/job", body["metadata"]["name"])
        )
        pods = [p for p in self.pods.values() if p.labels.get(label[0]) == label[1]]
        conditions = []
        if pods and all(p.phase == "Succeeded" for p in pods):
            conditions.append({"type": "Complete", "status": "True"})
        elif any(p.phase == "Failed" for p in pods):
            conditions.append(
                {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "a pod failed"}
            )
        return {**body, "status": {"conditions": conditions}}


def handler(cluster: FakeCluster) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _send(self, code: int, payload: dict[str, Any] | str) -> None:
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self) -> tuple[str, str, str | None, str | None, dict[str, list[str]]]:
            """(kind, namespace, name, subresource, query) of a request path."""
            url = urlparse(self.path)
            parts = url.path.strip("/").split("/")
            ns_at = parts.index("namespaces")
            namespace, plural = parts[ns_at + 1], parts[ns_at + 2]
            rest = parts[ns_at + 3 :]
            kind = {"services": "Service", "jobs": "Job", "trainjobs": "TrainJob", "pods": "Pod"}[plural]
            return (
                kind,
                namespace,
                (rest[0] if rest else None),
                (rest[1] if len(rest) > 1 else None),
                parse_qs(url.query),
            )

        def do_POST(self) -> None:
            kind, namespace, _, _, _ = self._route()
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if "name" not in body["metadata"]:  # generateName: the API server adds 5 random characters
                body["metadata"]["name"] = body["metadata"].pop("generateName") + uuid.uuid4().hex[:5]
            name = body["metadata"]["name"]
            with cluster.lock:
                cluster.requests.append(("POST", f"{kind} {namespace}/{name}"))
                cluster.received.append(body)
                if (kind, namespace, name) in cluster.objects:
                    return self._send(409, {"kind": "Status", "message": f"{kind} {name} already exists", "code": 409})
                cluster.objects[(kind, namespace, name)] = body
                if kind in ("Job", "TrainJob"):
                    cluster.start_pods(kind, body)
            self._send(201, body)

        def do_GET(self) -> None:
            kind, namespace, name, sub, query = self._route()
            with cluster.lock:
                if kind == "Pod" and name is None:
                    key, _, value = query.get("labelSelector", ["="])[0].partition("=")
                    items = [
                        p.to_json()
                        for p in cluster.pods.values()
                        if p.namespace == namespace and p.labels.get(key) == value
                    ]
                    return self._send(200, {"kind": "PodList", "apiVersion": "v1", "items": items})
                if kind == "Pod" and sub == "log":
                    pod = cluster.pods.get(name or "")
                    if pod is None:
                        return self._send(404, {"kind": "Status", "message": f"pod {name} not found", "code": 404})
                    lines = pod.log.read_text(errors="replace").splitlines(keepends=True)
                    return self._send(200, "".join(lines[-int(query.get("tailLines", ["200"])[0]) :]))
                if kind == "Pod" and name in cluster.pods:
                    return self._send(200, cluster.pods[name].to_json())
                body = cluster.objects.get((kind, namespace, name or ""))
                if body is None:
                    return self._send(404, {"kind": "Status", "message": f"{kind} {name} not found", "code": 404})
                self._send(200, cluster.status_of(kind, body))

        def do_DELETE(self) -> None:
            kind, namespace, name, _, query = self._route()
            length = int(self.headers.get("Content-Length") or 0)
            options = json.loads(self.rfile.read(length)) if length else {}
            policy = options.get("propagationPolicy") or query.get("propagationPolicy", [""])[0]
            cluster.requests.append(("DELETE", f"{kind} {namespace}/{name} {policy}".rstrip()))
            body = cluster.objects.pop((kind, namespace, name or ""), None)
            if body is None:
                return self._send(404, {"kind": "Status", "message": f"{kind} {name} not found", "code": 404})
            if kind == "Job":
                cluster.stop_pods(("tandem.dev/job", name or ""))
            elif kind == "TrainJob":
                cluster.stop_pods((JOBSET_LABEL, name or ""))
            self._send(200, {"kind": "Status", "status": "Success"})

    return Handler


def certificate(root: Path) -> None:
    """A self-signed certificate for 127.0.0.1 (root/cert.pem, root/key.pem): the API server's, and its own CA."""
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=kubernetes",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:kubernetes.default.svc",
            "-keyout", str(root / "key.pem"), "-out", str(root / "cert.pem"),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip


@contextlib.contextmanager
def mount_point(path: Path) -> Iterator[None]:
    """The directory the pods' service account is mounted on (each pod's mount is its own), created for the
    stand-in's lifetime where this machine has none, and removed after."""
    made = [parent for parent in [path, *path.parents] if not parent.exists()]
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield
    finally:
        for directory in made:  # deepest first; only the empty directories made here
            with contextlib.suppress(OSError):
                directory.rmdir()


@contextlib.contextmanager
def fake_cluster(root: Path) -> Iterator[FakeCluster]:
    """The fake cluster serving HTTPS on 127.0.0.1, and a kubeconfig for it at root/kubeconfig (KUBECONFIG points
    there while it runs)."""
    root.mkdir(parents=True, exist_ok=True)
    certificate(root)
    cluster = FakeCluster(root)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(cluster))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(root / "cert.pem", root / "key.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    cluster.url = f"https://127.0.0.1:{server.server_address[1]}"
    kubeconfig, ca = root / "kubeconfig", root / "cert.pem"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": cluster.url, "certificate-authority": str(ca)}}],
                "users": [{"name": "fake", "user": {"token": "not-a-secret"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                "current-context": "fake",
            }
        ),
        encoding="utf-8",
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    before = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(kubeconfig)
    try:
        with mount_point(SERVICE_ACCOUNT):
            yield cluster
    finally:
        if before is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = before
        cluster.shutdown()
        server.shutdown()
        server.server_close()
