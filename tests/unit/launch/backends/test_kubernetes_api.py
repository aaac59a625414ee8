"""The kubernetes backend's calls to the cluster (launch/backends/kubernetes_api.py): the pipeline's Role allows
every call its client makes, and the API server's refusals become one line with their fix and exit class. No API
server runs here (tests/kubernetes runs the client against a stand-in)."""

from __future__ import annotations

import kubernetes_validate
import pytest

from core.errors import RetryableError, UserError
from launch.backends.kubernetes_api import api_error
from tests.unit.launch.backends.test_kubernetes_render import K8S_VERSION


def test_the_pipelines_role_validates_and_allows_every_call_the_backend_makes() -> None:
    """deploy/kubernetes/rbac.yaml against the schemas, and each (group, resource, verb) the backend's client calls
    use (launch/backends/kubernetes_api.py `Cluster`) in its rules."""
    import yaml

    from core.checkout import PROJECT_ROOT

    documents = list(yaml.safe_load_all((PROJECT_ROOT / "deploy" / "kubernetes" / "rbac.yaml").read_text()))
    for document in documents:
        assert kubernetes_validate.validate(document, K8S_VERSION, strict=True) == K8S_VERSION
    (role,) = [d for d in documents if d["kind"] == "Role"]
    allowed = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    needed = {
        ("batch", "jobs", "create"), ("batch", "jobs/status", "get"), ("batch", "jobs", "delete"),
        ("", "services", "create"), ("", "services", "delete"), ("", "pods", "list"), ("", "pods/log", "get"),
        ("", "pods", "get"),  # the pipeline's own pod, the owner of the phase's objects
        ("trainer.kubeflow.org", "trainjobs", "create"), ("trainer.kubeflow.org", "trainjobs/status", "get"),
        ("trainer.kubeflow.org", "trainjobs", "delete"),
    }  # fmt: skip
    assert needed <= allowed


@pytest.mark.parametrize(
    ("status", "what", "kind", "said"),
    [
        (403, "create Job ml/x", UserError, "deploy/kubernetes/rbac.yaml"),
        (404, "create TrainJob ml/x", UserError, "install Kubeflow Trainer or leave launch.kubernetes.runtime empty"),
        (422, "create Job ml/x", UserError, "fix launch.kubernetes"),
        (409, "create Job ml/x", RetryableError, "(409: "),
        (503, "list the job's pods", RetryableError, "(503: "),
    ],
)
def test_the_api_servers_refusals_are_one_line_with_their_fix(status: int, what: str, kind: type, said: str) -> None:
    error = api_error(status, "the server could not find the requested resource", what)
    assert isinstance(error, kind) and said in str(error) and "\n" not in str(error)
