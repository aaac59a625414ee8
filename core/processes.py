"""This host's processes, the one check of them that several layers make: whether a pid is still alive (a run lock's
holder, a node claim's, a test's server)."""

from __future__ import annotations

import os


def pid_alive(pid: object) -> bool:
    """Whether a process of this host has this pid (one owned by another user counts as alive; a pid that is not an
    int, as read from a damaged document, does not)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
