"""What the `kubernetes` backend reads in the cluster's answers: a pod's phase, rank and exit code, what keeps a pod
from running (an image that cannot be pulled, a container that cannot start, OOMKilled: exit 2; evicted or preempted:
retryable; unschedulable, with the scheduler's message), a job the cluster ended with no pod failing, and a scheduling
timeout with how many nodes the cluster did place (TooFewNodes). Pure: status documents in, errors out.
"""

from __future__ import annotations

from typing import Any

from core.errors import RetryableError, TandemError, TooFewNodes, UserError
from launch.backends.kubernetes_render import COMPLETION_INDEX, CONTAINER, PodJob
from launch.job import Phase

# A pod's waiting reasons that no wait cures: the image, its name or the container's configuration.
BAD_IMAGE = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
BAD_CONFIG = {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
# How a pod's DisruptionTarget condition says it was taken away (retryable: the node was needed elsewhere or lost).
DISRUPTED = {"PreemptionByScheduler", "DeletionByTaintManager", "EvictionByEvictionAPI", "TerminationByKubelet"}


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


def job_failure(phase: Phase, failed: dict[str, Any]) -> TandemError:
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
