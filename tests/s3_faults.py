"""Real network faults for the S3 tests: an endpoint (moto's server on 127.0.0.1) that can be stopped and
started again on the same port, and a proxy that forwards requests but loses the answer to one of them.

moto keeps its buckets in this process's memory, so objects survive a stop and start: the endpoint behaves like
a store whose front end went away for a while.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

from moto.server import ThreadedMotoServer


class StoppableEndpoint:
    """A moto S3 endpoint on a fixed port that can be stopped (connections refused) and started again."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._server: ThreadedMotoServer | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Listen again (a no-op when running)."""
        with self._lock:
            if self._server is None:
                self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
                self._server.start()

    def stop(self) -> None:
        """Stop listening: every request is refused until start()."""
        with self._lock:
            if self._server is not None:
                self._server.stop()
                self._server = None

    def outage(self, after_s: float, for_s: float | None, when: Callable[[], bool] | None = None) -> threading.Thread:
        """Stop after `after_s` seconds (and, with `when`, once when() is true), for `for_s` seconds (None: for
        good), in a background thread; the thread's `stopped_at` is the monotonic time of the stop."""

        def run() -> None:
            time.sleep(after_s)
            while when is not None and not _true(when):
                time.sleep(0.2)
            self.stop()
            thread.stopped_at = time.monotonic()  # type: ignore[attr-defined]
            if for_s is not None:
                time.sleep(for_s)
                self.start()

        thread = threading.Thread(target=run, daemon=True)
        thread.stopped_at = None  # type: ignore[attr-defined]
        thread.start()
        return thread


def _true(condition: Callable[[], bool]) -> bool:
    try:
        return condition()
    except Exception:  # noqa: BLE001 - not there yet (the object may not exist): ask again
        return False


class LoseOneAnswer:
    """A TCP proxy to an HTTP endpoint that forwards every request, but for the first one `matches` picks it
    sends the upstream's answer nowhere and resets the client's connection: the request took effect, the
    client never learns it. Each request gets its own upstream connection (Connection: close)."""

    def __init__(self, upstream_port: int, matches: Callable[[bytes], bool]) -> None:
        self.matches = matches
        self.armed = True
        self.lost: list[bytes] = []
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        """Stop accepting connections."""
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client:
            while True:
                request = _read_request(client)
                if request is None:
                    return
                head, _, body = request.partition(b"\r\n\r\n")
                lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
                request = b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body
                with socket.create_connection(("127.0.0.1", self.upstream_port)) as upstream:
                    upstream.sendall(request)
                    answer = b"".join(iter(lambda: upstream.recv(65536), b""))
                if self.armed and self.matches(head):
                    self.armed = False
                    self.lost.append(head.split(b"\r\n", 1)[0])
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    return  # closing with linger 0 sends a reset: the answer is lost
                client.sendall(answer.replace(b"Connection: keep-alive", b"Connection: close"))
                return


def _read_request(sock: socket.socket) -> bytes | None:
    """One HTTP request (headers and a Content-Length body), or None when the client closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    kept = []
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
        if name.strip().lower() == b"expect":  # botocore asks before sending a PUT body: answer for upstream
            sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            continue
        kept.append(line)
    head = b"\r\n".join(kept)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body
