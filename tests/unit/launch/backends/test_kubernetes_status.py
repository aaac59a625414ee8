"""What the kubernetes backend reads in the cluster's answers (launch/backends/kubernetes_status.py): the one line and
exit class a pod's status becomes, a pod waiting for the scheduler, and the scheduling timeout's count of the nodes
placed. Status documents as the kubelet and the controllers write them; no cluster runs here."""

from __future__ import annotations

import pytest

from core.errors import RetryableError, TooFewNodes, UserError
from launch.backends.kubernetes_status import (
    completion_index,
    job_failure,
    pod_problem,
    too_few_nodes,
    unschedulable,
)
from launch.job import TRAIN
from tests.unit.launch.backends.test_kubernetes_render import job


def pod(status: dict, name: str = "tandem-r-train-ab12-1-x") -> dict:
    return {
        "metadata": {"name": name, "annotations": {"batch.kubernetes.io/job-completion-index": "1"}},
        "status": status,
    }


@pytest.mark.parametrize(
    ("status", "kind", "said"),
    [
        (
            {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."},
            RetryableError,
            "was evicted",
        ),
        (
            {
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "PreemptionByScheduler",
                        "message": "preempted by ml/high-priority",
                    }
                ]
            },
            RetryableError,
            "was preempted (PreemptionByScheduler",
        ),
        (
            {
                "containerStatuses": [
                    {
                        "name": "node",
                        "image": "r/t:9",
                        "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}},
                    }
                ]
            },
            UserError,
            "image 'r/t:9' cannot be pulled (ImagePullBackOff",
        ),
        (
            {
                "containerStatuses": [
                    {"name": "node", "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}
                ]
            },
            UserError,
            "was killed for memory (OOMKilled",
        ),
        (
            {
                "containerStatuses": [
                    {
                        "name": "node",
                        "state": {
                            "waiting": {
                                "reason": "CreateContainerConfigError",
                                "message": "couldn't find key HF_TOKEN in Secret ml/tandem-creds",
                            }
                        },
                    }
                ]
            },
            UserError,
            "add it to launch.kubernetes.secret",
        ),
    ],
)
def test_what_keeps_a_pod_from_running_is_one_line_of_its_class(status: dict, kind: type, said: str) -> None:
    problem = pod_problem(pod(status))
    assert isinstance(problem, kind) and said in str(problem) and "\n" not in str(problem)


def test_a_pod_that_waits_for_the_scheduler_is_not_a_failure_yet() -> None:
    waiting = pod(
        {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
                }
            ],
        }
    )
    assert pod_problem(waiting) is None and completion_index(waiting) == 1
    assert (
        unschedulable(waiting) == "pod tandem-r-train-ab12-1-x: 0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    )
    deadline = job_failure(TRAIN, {"reason": "DeadlineExceeded", "message": "Job was active longer than specified"})
    assert isinstance(deadline, UserError) and "launch.kubernetes.active_deadline_s" in str(deadline)


def test_the_scheduling_timeout_counts_the_pods_placed_and_a_slow_pull_is_no_shortage() -> None:
    """Of 3 pods, one the scheduler cannot place: TooFewNodes(2), so an elastic run starts again on 2. Every pod
    placed, one still pulling its image: a plain retryable line naming that pod, never a 'shortage' of 3 nodes (an
    elastic run would start again on as many, and wait as long, for ever)."""
    submission = job(["launch.nnodes=3", "launch.kubernetes.schedule_timeout_s=60"])
    running = pod({"phase": "Running"}, "p-0")
    pulling = pod(
        {
            "phase": "Pending",
            "containerStatuses": [{"name": "node", "state": {"waiting": {"reason": "ContainerCreating"}}}],
        },
        "p-2",
    )
    unplaced = pod(
        {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes fit"}
            ],
        },
        "p-1",
    )
    short = too_few_nodes(submission, [running, unplaced, pulling], [str(unschedulable(unplaced))])
    assert isinstance(short, TooFewNodes) and short.nodes == 2 and "(pod p-1: 0/2 nodes fit)" in str(short)
    slow = too_few_nodes(submission, [running, running, pulling], [])
    assert type(slow) is RetryableError and str(slow) == (
        "train: not every pod runs after 60 s (pod p-2: Pending, ContainerCreating); free the nodes or raise "
        "launch.kubernetes.schedule_timeout_s"
    )
