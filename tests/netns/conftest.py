"""The session's machines for the `netns` suite (tests/netns/hosts.py): three network namespaces with sshd, built
once and removed whatever happens."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.netns.hosts import Machines, build, cleanup, missing_requirements


@pytest.fixture(scope="session")
def machines(tmp_path_factory) -> Iterator[Machines]:
    """Three 'hosts' (10.87.0.11-13) reachable over ssh with the fixture's own key and known_hosts."""
    if (why := missing_requirements()) is not None:
        pytest.skip(f"{why}; the netns suite runs as root with Debian's openssh-server")
    built = None
    try:
        built = build(tmp_path_factory.mktemp("netns"), 3)
        yield built
    finally:
        if built is not None:
            for sshd in built.sshd:
                sshd.terminate()
        cleanup()
