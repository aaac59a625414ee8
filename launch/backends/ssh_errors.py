"""What an OpenSSH failure means, in one line with its fix: ssh's own stderr classified by the phrases OpenSSH
prints (it has no other channel: every failure of the client itself is exit 255)."""

from __future__ import annotations

from core.errors import RetryableError, UserError

# (phrase in ssh's stderr, what to do, whether a retry may help); the first match wins.
_CAUSES = (
    (
        "Permission denied",
        "install this machine's key on it (ssh-copy-id), or name the key with launch.ssh_options=[-i, KEY]",
        False,
    ),
    ("Host key verification failed", "accept its host key once (ssh it by hand) or add it to known_hosts", False),
    ("REMOTE HOST IDENTIFICATION HAS CHANGED", "its host key changed: check the host, then update known_hosts", False),
    ("Could not resolve hostname", "fix the name in launch.hosts / launch.hostfile, or use its address", False),
    ("Connection refused", "no sshd listens there: start sshd, or give the port as host:port", True),
    ("timed out", "the host does not answer: is it up, and is launch.ssh_connect_timeout long enough?", True),
    ("No route to host", "the host is unreachable from here: check the address and the network", True),
    ("Network is unreachable", "the host is unreachable from here: check the address and the network", True),
    ("Connection closed", "sshd closed the connection: check its logs (MaxStartups, AllowUsers)", True),
)


def ssh_failure(where: str, code: int, stderr: str) -> UserError | RetryableError:
    """The one-line error for an ssh that failed on its own (exit 255) or whose remote command failed."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("Warning:")]
    for phrase, fix, retryable in _CAUSES:
        said = next((line for line in lines if phrase.lower() in line.lower()), None)
        if said is not None:
            message = f"{where}: {_trim(said)} — {fix}"
            return RetryableError(message) if retryable else UserError(message)
    said = lines[-1] if lines else f"ssh exited with code {code} and no message"
    return RetryableError(f"{where}: ssh failed ({_trim(said)}); try `ssh -o BatchMode=yes HOST true` by hand")


def _trim(line: str) -> str:
    """ssh's line without its 'user@host: ' prefix (the error names the host already)."""
    return line.split(": ", 1)[1] if ": " in line and "@" in line.split(": ", 1)[0] else line
