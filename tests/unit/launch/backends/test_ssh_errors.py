"""ssh's failures (launch/backends/ssh_errors.py) as one line with the fix, without a network."""

from __future__ import annotations

from core.errors import RetryableError, UserError
from launch.backends.ssh_errors import ssh_failure


def test_ssh_failures_are_one_line_with_the_fix() -> None:
    denied = ssh_failure("node 1 (10.0.0.2)", 255, "root@10.0.0.2: Permission denied (publickey).\n")
    assert isinstance(denied, UserError)
    assert str(denied) == (
        "node 1 (10.0.0.2): Permission denied (publickey). — install this machine's key on it "
        "(ssh-copy-id), or name the key with launch.ssh_options=[-i, KEY]"
    )
    down = ssh_failure("node 2 (gpu3)", 255, "ssh: connect to host gpu3 port 22: Connection timed out\n")
    assert isinstance(down, RetryableError) and "the host does not answer" in str(down)
    assert "ssh failed (weird)" in str(ssh_failure("node 0 (a)", 255, "weird\n"))
