"""The `launch` section's checks (forwarded names, what a backend needs, the hosts), each a one-line error naming the
key, and the rendezvous address it resolves."""

from __future__ import annotations

import pytest

from config.loader import load_config
from core.errors import UserError


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["launch.forward_env=[HF_TOKEN, 9LIVES]"], "launch.forward_env: '9LIVES' is not an environment variable name"),
        (["launch.forward_env=[HF_TOKEN, HF_TOKEN]"], "launch.forward_env: HF_TOKEN is listed twice"),
        (
            ["launch.forward_env=[NCCL_DEBUG]", "launch.env.NCCL_DEBUG=INFO"],
            "launch.env.NCCL_DEBUG is also in launch.forward_env; keep it in one place",
        ),
    ],
)
def test_bad_forwarded_names_are_refused(overrides: list[str], expected: str) -> None:
    with pytest.raises(UserError, match=expected):
        load_config(None, overrides)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["launch.backend=kubernetes"],
            "launch.backend=kubernetes needs launch.kubernetes.image: the image every node's pod runs",
        ),
        (
            [
                "launch.backend=kubernetes",
                "launch.kubernetes.image=i:1",
                "launch.forward_env=[HF_TOKEN, WANDB_API_KEY]",
            ],
            "launch.forward_env with launch.backend=kubernetes needs launch.kubernetes.secret: a Secret in "
            "launch.kubernetes.namespace with the keys HF_TOKEN, WANDB_API_KEY",
        ),
        (
            ["launch.backend=ssh", "launch.hosts=[a, me@a:2222]"],
            "launch.hosts lists a host twice (a, me@a:2222); one entry per node",
        ),
    ],
)
def test_what_a_backend_needs_is_named_in_one_line(overrides: list[str], expected: str) -> None:
    with pytest.raises(UserError) as info:
        load_config(None, overrides)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_the_rendezvous_is_node_0_of_the_hosts_unless_master_addr_says_otherwise() -> None:
    assert load_config(None, ["launch.backend=ssh", "launch.hosts=[me@g1:2222, g2]"]).launch.rendezvous_addr == "g1"
    cfg = load_config(None, ["launch.backend=ssh", "launch.hosts=[g1, g2]", "launch.master_addr=10.1.0.1"])
    assert cfg.launch.rendezvous_addr == "10.1.0.1"
