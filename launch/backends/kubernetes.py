"""`launch.backend: kubernetes`: each phase as a Kubeflow Trainer TrainJob or an indexed Job with a headless Service
(launch/backends/kubernetes_render.py), one pod per node running `python -m flows.node`, submitted, followed and
deleted through the official client.

The client finds the cluster as kubectl does: the pod's service account inside the cluster, else KUBECONFIG or
~/.kube/config. The phase is followed by polling the job's conditions and its pods: a pod that cannot run is one line
from its status (an image that cannot be pulled, OOMKilled, evicted or preempted: retryable, unschedulable past
launch.kubernetes.schedule_timeout_s with the scheduler's message), a node that failed is its own `error:` line from
the pod's log with its exit code's class, progress and stalls come from storage as on every backend. Whatever way
this function exits (done, failed, cancelled), the phase's objects are deleted with foreground propagation, so no pod
outlives it; pods whose pipeline died stop on their own (flows/node.py follows the pipeline's liveness record), and
launch.kubernetes.active_deadline_s bounds them on the cluster's side.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.errors import RetryableError, TandemError, TooFewNodes, UserError
from launch.backends.kubernetes_render import (
    COMPLETION_INDEX,
    CONTAINER,
    JOB_LABEL,
    TRAINER_GROUP,
    Owner,
    PodJob,
    render,
)
from launch.diagnose import error_for
from launch.job import Info, OnProgress, PhaseJob
from launch.supervise import Failure, supervise
from launch.watch import Watch, phase_watch

log = logging.getLogger(__name__)
POLL_S = 2.0
TRAINER_VERSION = "v1alpha1"
TRAINJOBS = "trainjobs"
# The label Kubeflow Trainer's JobSet puts on a TrainJob's pods (our own label marks an indexed Job's).
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
# A pod's waiting reasons that no wait cures: the image, its name or the container's configuration.
BAD_IMAGE = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
BAD_CONFIG = {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
# How a pod's DisruptionTarget condition says it was taken away (retryable: the node was needed elsewhere or lost).
DISRUPTED = {"PreemptionByScheduler", "DeletionByTaintManager", "EvictionByEvictionAPI", "TerminationByKubelet"}
LOG_LINES = 200
# Where a pod finds its service account, and its namespace (the in-cluster client reads the same).
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def pod_job(job: PhaseJob, owner: Owner | None = None) -> PodJob:
    """The renderer's view of a phase: a fresh suffix per submission, so that a retry never meets the objects of the
    attempt before it while they are still being deleted."""
    spec = job.written.spec
    return PodJob(spec.config, spec.run_id, spec.run, job.phase, job.node_args, secrets.token_hex(2), owner)


def run_kubernetes_nodes(job: PhaseJob, info: Info, on_progress: OnProgress | None = None) -> None:
    """Submit the phase's objects, follow them until the phase completed, and delete them; raise naming the failure."""
    cluster = Cluster(api_client())
    submission = pod_job(job, pipeline_pod(cluster, job.written.spec.config.launch.kubernetes.namespace))
    objects = render(submission)
    launch = submission.config.launch
    created: list[dict[str, Any]] = []
    try:
        for body in objects:
            cluster.create(body)
            created.append(body)
        meta = objects[-1]["metadata"]
        info(
            f"{job.phase}: {objects[-1]['kind']} {meta['namespace']}/{meta['name']} submitted ({launch.nnodes} pods "
            f"of {launch.nproc_per_node} rank(s))"
        )
        follow(cluster, submission, objects[-1], info, on_progress)
    finally:
        for body in reversed(created):
            cluster.delete(body)


def pipeline_pod(cluster: Cluster, namespace: str) -> Owner | None:
    """The pod this pipeline runs in, as the owner of the phase's objects: so a pipeline killed without unwinding
    (its pod evicted, deleted, or its Job's deadline) leaves nothing behind once its pod is gone. None outside a pod,
    and for objects in another namespace than the pod's (the garbage collector refuses owners across namespaces)."""
    try:
        own = (SERVICE_ACCOUNT / "namespace").read_text().strip()
    except OSError:
        return None  # not in a pod
    if own != namespace:
        log.warning(
            "kubernetes: the pipeline's pod is in namespace %s, the phase's objects in %s: they get no owner "
            "reference, so a pipeline killed without unwinding leaves them (stopped) until deleted by its run label",
            own,
            namespace,
        )
        return None
    name = os.environ.get("HOSTNAME") or socket.gethostname()  # a pod's hostname is its name
    try:
        uid = cluster.pod(name, namespace)["metadata"]["uid"]
    except Exception as exc:  # noqa: BLE001 - without an owner the phase runs as before; the line says why
        log.warning("kubernetes: no owner for the phase's objects: cannot read pod %s/%s (%s)", namespace, name, exc)
        return None
    return Owner(name, uid, namespace)


def api_client() -> Any:
    """A client for the cluster: in-cluster credentials in a pod, else the kubeconfig; none is one line, exit 2."""
    from kubernetes import client, config

    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
        else:
            # KUBECONFIG as it is now (the client reads it once, at import): kubectl's order, then ~/.kube/config.
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    except (config.ConfigException, OSError) as exc:
        raise UserError(
            f"launch.backend=kubernetes: no cluster configured ({str(exc).splitlines()[0]}); run the pipeline in the "
            "cluster with a service account (docs/kubernetes.md) or point KUBECONFIG at the cluster's kubeconfig"
        ) from None
    return client.ApiClient()


class Cluster:
    """The calls the backend makes: create and delete the rendered objects; read the job, its pods and their logs
    as plain JSON dicts (what the API server sent)."""

    def __init__(self, api: Any) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def job(self, body: dict[str, Any]) -> dict[str, Any]:
        meta = body["metadata"]
        if body["kind"] == "TrainJob":
            return self.custom.get_namespaced_custom_object_status(
                TRAINER_GROUP, TRAINER_VERSION, meta["namespace"], TRAINJOBS, meta["name"]
            )
        return _json(self.batch.read_namespaced_job_status(meta["name"], meta["namespace"], _preload_content=False))

    def pods(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        meta = body["metadata"]
        label = JOBSET_LABEL if body["kind"] == "TrainJob" else JOB_LABEL
        listed = self.core.list_namespaced_pod(
            meta["namespace"], label_selector=f"{label}={meta['name']}", _preload_content=False
        )
        return sorted(_json(listed).get("items", []), key=lambda pod: pod["metadata"]["name"])

    def pod(self, name: str, namespace: str) -> dict[str, Any]:
        return _json(self.core.read_namespaced_pod(name, namespace, _preload_content=False))

    def log(self, pod: dict[str, Any]) -> str:
        meta = pod["metadata"]
        try:
            response = self.core.read_namespaced_pod_log(
                meta["name"], meta["namespace"], container=CONTAINER, tail_lines=LOG_LINES, _preload_content=False
            )
        except Exception:  # noqa: BLE001 - a pod without a log (never started): its status speaks instead
            return ""
        return response.data.decode("utf-8", errors="replace")

    def create(self, body: dict[str, Any]) -> None:
        """Create one rendered object."""
        meta, kind = body["metadata"], body["kind"]
        namespace = meta["namespace"]
        what = f"create {kind} {namespace}/{meta['name']}"
        if kind == "Service":
            api_call(lambda: self.core.create_namespaced_service(namespace, body), what)
        elif kind == "Job":
            api_call(lambda: self.batch.create_namespaced_job(namespace, body), what)
        else:
            api_call(
                lambda: self.custom.create_namespaced_custom_object(
                    TRAINER_GROUP, TRAINER_VERSION, namespace, TRAINJOBS, body
                ),
                what,
            )

    def delete(self, body: dict[str, Any]) -> None:
        """Delete one object and, through foreground propagation, its pods; one already gone is fine, and a failure
        is logged rather than raised (the phase's own outcome is what the user needs)."""
        meta, kind = body["metadata"], body["kind"]
        name, namespace = meta["name"], meta["namespace"]
        try:
            if kind == "Service":
                self.core.delete_namespaced_service(name, namespace)
            elif kind == "Job":
                self.batch.delete_namespaced_job(name, namespace, propagation_policy="Foreground")
            else:
                self.custom.delete_namespaced_custom_object(
                    TRAINER_GROUP, TRAINER_VERSION, namespace, TRAINJOBS, name, propagation_policy="Foreground"
                )
        except Exception as exc:  # noqa: BLE001
            if getattr(exc, "status", None) != 404:
                log.warning("kubernetes: could not delete %s %s/%s: %s", kind, namespace, name, exc)


def _json(response: Any) -> dict[str, Any]:
    return json.loads(response.data)


def follow(
    cluster: Cluster, submission: PodJob, body: dict[str, Any], info: Info, on_progress: OnProgress | None
) -> None:
    """Follow the pods with the one supervise loop until every node's pod succeeded; raise the failure that caused
    the others (a node's own error line over its peers' lost connections), or what the pods' state says first."""
    pods = PodsFollow(cluster, submission, body, info, on_progress)
    supervise([PodMember(pods, index) for index in range(submission.config.launch.nnodes)], [pods], POLL_S)


class PodsFollow:
    """The poller of the loop: each turn reads the job and its pods, and raises what keeps a pod from running (its
    status), what ended the job without a pod failing (its deadline), a scheduling timeout, or a stall."""

    def __init__(
        self, cluster: Cluster, submission: PodJob, body: dict[str, Any], info: Info, on_progress: OnProgress | None
    ) -> None:
        self.cluster, self.submission, self.body, self.info = cluster, submission, body, info
        self.on_progress = on_progress
        self.by_index: dict[int, dict[str, Any]] = {}
        self.watch: Watch | None = None
        self.watching = False
        self.started = time.monotonic()
        self.said: set[str] = set()

    def poll(self) -> None:
        launch, phase = self.submission.config.launch, self.submission.phase
        status = api_call(lambda: self.cluster.job(self.body), "read the job's status")
        pods = api_call(lambda: self.cluster.pods(self.body), "list the job's pods")
        self.by_index = {index: pod for pod in pods if (index := completion_index(pod)) is not None}
        for pod in pods:
            if (problem := pod_problem(pod)) is not None:
                raise problem
        failed = condition(status, "Failed")
        if failed is not None and not any(phase_of(pod) == "Failed" for pod in pods):
            raise job_failure(phase, failed)
        waiting = [why for pod in pods if (why := unschedulable(pod))]
        if waiting and waiting[0] not in self.said:
            self.said.add(waiting[0])
            self.info(f"{phase}: waiting for the scheduler: {waiting[0]}")
        running = len(pods) == launch.nnodes and all(
            phase_of(pod) in ("Running", "Succeeded", "Failed") for pod in pods
        )
        if not running and time.monotonic() - self.started > launch.kubernetes.schedule_timeout_s:
            raise too_few_nodes(self.submission, pods, waiting)
        if running and not self.watching:  # time in the queue is not a stall: start the clock once every pod runs
            self.watch, self.watching = phase_watch(self.submission.run, launch, phase, self.on_progress), True
        if self.watch is not None:
            self.watch.poll()


def too_few_nodes(submission: PodJob, pods: list[dict[str, Any]], waiting: list[str]) -> RetryableError:
    """The scheduling timeout, with how many nodes the cluster did place (TooFewNodes): the pods it scheduled, or
    under a Kueue queue with nothing admitted one fewer than asked (a queue admits all of a job's pods or none, so
    the next size down is the one to try). Every pod placed but one not running yet (a slow image pull) is no
    shortage of nodes: a plain RetryableError, so that an elastic run does not start again on as many."""
    launch, phase = submission.config.launch, submission.phase
    kube = launch.kubernetes
    if kube.queue and not pods:
        why = f"queue {kube.queue} admitted none of the {launch.nnodes} pods"
        placed = launch.nnodes - 1
    else:
        placed = len(pods) - len(waiting)
        why = waiting[0] if waiting else not_running(pods) or f"{len(pods)} of {launch.nnodes} pods created"
    line = (
        f"{phase}: not every pod runs after {kube.schedule_timeout_s} s ({why}); free the nodes or raise "
        "launch.kubernetes.schedule_timeout_s"
    )
    return TooFewNodes(line, placed) if placed < launch.nnodes else RetryableError(line)


def not_running(pods: list[dict[str, Any]]) -> str | None:
    """The first placed pod that is not running yet, with what its container waits for (ContainerCreating, an image
    being pulled)."""
    for pod in pods:
        if phase_of(pod) == "Pending":
            states = [
                c.get("state", {}).get("waiting") or {} for c in pod.get("status", {}).get("containerStatuses") or []
            ]
            reason = next((state.get("reason") for state in states if state.get("reason")), "not started")
            return f"pod {pod['metadata']['name']}: Pending, {reason}"
    return None


class PodMember:
    """One node's pod as a member of the supervise loop: its exit code once it ended, its own error line."""

    def __init__(self, pods: PodsFollow, index: int) -> None:
        self.pods, self.index = pods, index
        self.ended_at: float | None = None

    def returncode(self) -> int | None:
        pod = self.pods.by_index.get(self.index)
        if pod is None or phase_of(pod) not in ("Succeeded", "Failed"):
            return None
        self.ended_at = self.ended_at or time.monotonic()
        return 0 if phase_of(pod) == "Succeeded" else (exit_code(pod) or 1)

    def failure(self) -> Failure:
        pod = self.pods.by_index[self.index]
        code, name = exit_code(pod), pod["metadata"]["name"]
        log = self.pods.cluster.log(pod)
        lines = [line[len("error: ") :] for line in log.splitlines() if line.startswith("error: ")]
        said = lines[0] if lines else f"exited with code {code} and no error line (kubectl logs {name})"
        error = error_for(code, f"{self.pods.submission.phase}: {said} (pod {name})")
        return Failure(error, code, self.ended_at or time.monotonic())


def phase_of(pod: dict[str, Any]) -> str:
    return str(pod.get("status", {}).get("phase", "Pending"))


def completion_index(pod: dict[str, Any]) -> int | None:
    """A pod's node rank: its completion index (an indexed Job's, and the Job a TrainJob's JobSet makes)."""
    meta = pod["metadata"]
    found = (meta.get("annotations") or {}).get(COMPLETION_INDEX) or (meta.get("labels") or {}).get(COMPLETION_INDEX)
    return int(found) if found is not None and str(found).isdigit() else None


def condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """A true condition of that type in an object's status (a Job's or a TrainJob's)."""
    for found in status.get("status", {}).get("conditions") or []:
        if found.get("type") == kind and found.get("status") == "True":
            return found
    return None


def pod_problem(pod: dict[str, Any]) -> TandemError | None:
    """What keeps a pod from running, as the one line and class the user gets: None while it may still run."""
    name = pod["metadata"]["name"]
    status = pod.get("status", {})
    if status.get("reason") == "Evicted":
        message = status.get("message", "no message")
        return RetryableError(f"pod {name} was evicted: {message}; the retry reschedules it")
    for found in status.get("conditions") or []:
        disrupted = found.get("type") == "DisruptionTarget" and found.get("status") == "True"
        if disrupted and found.get("reason") in DISRUPTED:
            return RetryableError(
                f"pod {name} was preempted ({found['reason']}: {found.get('message', '')}); the retry resumes "
                "from the newest checkpoint"
            )
    for container in status.get("containerStatuses") or []:
        waiting = container.get("state", {}).get("waiting") or {}
        terminated = container.get("state", {}).get("terminated") or {}
        if waiting.get("reason") in BAD_IMAGE:
            return UserError(
                f"pod {name}: image {container.get('image')!r} cannot be pulled ({waiting['reason']}: "
                f"{waiting.get('message', '')}); fix launch.kubernetes.image or the namespace's pull secret"
            )
        if waiting.get("reason") in BAD_CONFIG:
            return UserError(
                f"pod {name}: its container cannot start ({waiting['reason']}: {waiting.get('message', '')}); a "
                "missing Secret key of launch.forward_env is the usual cause: add it to launch.kubernetes.secret"
            )
        if terminated.get("reason") == "OOMKilled":
            return UserError(
                f"pod {name} was killed for memory (OOMKilled, limit {memory_limit(pod)}); raise "
                "launch.kubernetes.resources.memory or lower train.micro_batch_size (python -m flows.finetune --plan "
                "shows the host memory a node needs)"
            )
    return None


def memory_limit(pod: dict[str, Any]) -> str:
    for container in pod.get("spec", {}).get("containers") or []:
        if limit := container.get("resources", {}).get("limits", {}).get("memory"):
            return str(limit)
    return "none set"


def unschedulable(pod: dict[str, Any]) -> str | None:
    """The scheduler's message for a pod it cannot place yet (insufficient GPUs, a taint, a selector)."""
    for found in pod.get("status", {}).get("conditions") or []:
        waiting = found.get("type") == "PodScheduled" and found.get("status") == "False"
        if waiting and found.get("reason") == "Unschedulable":
            return f"pod {pod['metadata']['name']}: {found.get('message', 'unschedulable')}"
    return None


def job_failure(phase: str, failed: dict[str, Any]) -> TandemError:
    """A job the cluster ended with no pod failing: its deadline (exit 2), or another reason (retryable)."""
    reason, message = failed.get("reason", "Failed"), failed.get("message", "")
    if reason == "DeadlineExceeded":
        return UserError(
            f"{phase}: the job ran past launch.kubernetes.active_deadline_s ({message}); raise it or leave it empty"
        )
    return RetryableError(f"{phase}: the job failed ({reason}: {message})")


def exit_code(pod: dict[str, Any]) -> int | None:
    for container in pod.get("status", {}).get("containerStatuses") or []:
        if container.get("name") == CONTAINER and (terminated := container.get("state", {}).get("terminated")):
            return int(terminated.get("exitCode", 1))
    return None


def api_call(call: Callable[[], Any], what: str) -> Any:
    """One API call; the API server's refusals as one line with their fix."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    try:
        return call()
    except ApiException as exc:
        raise api_error(exc.status, api_message(exc.body), what) from None
    except HTTPError as exc:
        raise RetryableError(f"kubernetes: cannot {what}: the API server did not answer ({exc})") from None


def api_message(body: Any) -> str:
    try:
        return str(json.loads(body).get("message", body))
    except (TypeError, ValueError, AttributeError):
        return str(body)


def api_error(status: int, message: str, what: str) -> TandemError:
    """401/403: credentials or RBAC (exit 2); 404 on a TrainJob: no Kubeflow Trainer; 422: an invalid object; else
    retryable (the API server busy, a conflict with a deletion in progress)."""
    if status in (401, 403):
        return UserError(
            f"kubernetes: not allowed to {what} ({message}); give the pipeline's service account the Role of "
            "deploy/kubernetes/rbac.yaml"
        )
    if status == 404 and "TrainJob" in what:
        return UserError(
            f"kubernetes: cannot {what}: the cluster has no TrainJob API ({message}); install Kubeflow Trainer or "
            "leave launch.kubernetes.runtime empty (an indexed Job)"
        )
    if status in (400, 404, 422):
        return UserError(f"kubernetes: cannot {what} ({status}: {message}); fix launch.kubernetes")
    return RetryableError(f"kubernetes: cannot {what} ({status}: {message})")
