"""`launch.backend: kubernetes`: each phase as a Kubeflow Trainer TrainJob or an indexed Job with a headless Service
(launch/backends/kubernetes_render.py), one pod per node running `python -m launch.node`, submitted, followed and
deleted through the official client (launch/backends/kubernetes_api.py).

The phase is followed by polling the job's conditions and its pods (launch/backends/kubernetes_status.py reads them):
a pod that cannot run is one line from its status (an image that cannot be pulled, OOMKilled, evicted or preempted:
retryable, unschedulable past launch.kubernetes.schedule_timeout_s with the scheduler's message), a node that failed
is its own `error:` line from the pod's log with its exit code's class, progress and stalls come from storage as on
every backend. Whatever way the phase ends (done, failed, cancelled), its objects are deleted with foreground
propagation (`KubernetesPhase.cancel`), so no pod outlives it; pods whose pipeline died stop on their own (a node
follows the pipeline's liveness record), and launch.kubernetes.active_deadline_s bounds them on the cluster's side.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import yaml

from config.sections.launch import LaunchConfig
from launch.backend import started
from launch.backends.kubernetes_api import Cluster, api_call, api_client, pipeline_pod
from launch.backends.kubernetes_render import Owner, PodJob, render
from launch.backends.kubernetes_status import (
    completion_index,
    condition,
    exit_code,
    job_failure,
    phase_of,
    pod_problem,
    too_few_nodes,
    unschedulable,
)
from launch.diagnose import error_for
from launch.elastic import resized
from launch.job import Info, OnProgress, PhaseJob
from launch.supervise import Failure, supervise
from launch.watch import Watch, phase_watch
from storage.spec import Attempt, Spec

POLL_S = 2.0
# What a description shows for the suffix each submission draws (so that a retry never meets the objects of the
# attempt before it while they are still being deleted).
DESCRIBED_SUFFIX = "xxxx"


def pod_job(job: PhaseJob, owner: Owner | None = None, suffix: str | None = None) -> PodJob:
    """The renderer's view of a phase: a fresh suffix per submission unless one is given."""
    spec = job.written.spec
    return PodJob(
        spec.config,
        spec.run_id,
        spec.run,
        job.phase,
        job.node_args,
        suffix or secrets.token_hex(2),
        owner,
        dict(job.env),
    )


class KubernetesBackend:
    """`launch.backend: kubernetes`: one pod per node, through the cluster's API server."""

    elastic = True  # an attempt asks for its nodes; the next starts on as many as the cluster placed

    def describe(self, job: PhaseJob) -> str:
        """The phase's objects as YAML documents, as they are submitted."""
        namespace = job.written.spec.config.launch.kubernetes.namespace
        head = (
            f"# launch.backend=kubernetes: the objects of the {job.phase} phase, created in namespace {namespace} in "
            f"this order; at submission {DESCRIBED_SUFFIX} is a fresh suffix, and the pipeline's pod is their owner "
            "when it runs in that namespace\n"
        )
        objects = render(pod_job(job, suffix=DESCRIBED_SUFFIX))
        return head + yaml.safe_dump_all(objects, sort_keys=False, explicit_start=True)

    def submit(self, job: PhaseJob, info: Info) -> KubernetesPhase:
        """Create the phase's objects, their owner the pipeline's pod when it runs in their namespace."""
        cluster = Cluster(api_client())
        submission = pod_job(job, pipeline_pod(cluster, job.written.spec.config.launch.kubernetes.namespace))
        phase = KubernetesPhase(cluster, submission, render(submission), info)
        return started(phase, phase.create)

    def probe(self, spec: Spec, slot: int) -> str | None:
        """None: the cluster's scheduler places the pods, and each pod preflights its own node."""
        return None

    def attempt_launch(self, launch: LaunchConfig, attempt: Attempt) -> LaunchConfig:
        """As many pods as the attempt has nodes."""
        return resized(launch, attempt)


@dataclass
class KubernetesPhase:
    """A phase's objects on the cluster: created in order, followed through their pods, deleted in reverse."""

    cluster: Cluster
    submission: PodJob
    objects: list[dict[str, Any]]
    info: Info
    created: list[dict[str, Any]] = field(default_factory=list)

    def create(self) -> None:
        """Create every object, in order."""
        for body in self.objects:
            self.cluster.create(body)
            self.created.append(body)
        meta, launch = self.objects[-1]["metadata"], self.submission.config.launch
        self.info(
            f"{self.submission.phase}: {self.objects[-1]['kind']} {meta['namespace']}/{meta['name']} submitted "
            f"({launch.nnodes} pods of {launch.nproc_per_node} rank(s))"
        )

    def follow(self, on_progress: OnProgress | None) -> None:
        """Until every node's pod succeeded; raise what failed first."""
        follow(self.cluster, self.submission, self.objects[-1], self.info, on_progress)

    def cancel(self, *, failed: bool) -> None:
        """Delete what was created, last first, with foreground propagation (the kubelet gives each pod its
        terminationGracePeriodSeconds, whatever `failed`)."""
        for body in reversed(self.created):
            self.cluster.delete(body)


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
