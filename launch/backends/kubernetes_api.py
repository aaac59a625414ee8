"""The `kubernetes` backend's calls to the cluster, through the official client: the client found as kubectl finds
the cluster (the pod's service account inside the cluster, else KUBECONFIG or ~/.kube/config), the objects created,
read and deleted as plain JSON dicts (what the API server sent), the pod the pipeline runs in (the owner of a phase's
objects), and the API server's refusals as one line with their fix.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.errors import RetryableError, TandemError, UserError
from launch.backends.kubernetes_render import CONTAINER, JOB_LABEL, TRAINER_GROUP, Owner

log = logging.getLogger(__name__)
TRAINER_VERSION = "v1alpha1"
TRAINJOBS = "trainjobs"
# The label Kubeflow Trainer's JobSet puts on a TrainJob's pods (our own label marks an indexed Job's).
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
LOG_LINES = 200
# Where a pod finds its service account, and its namespace (the in-cluster client reads the same).
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


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
