"""The HTTP server of the metrics endpoint: no client, idle, slow or many, can stall it or its stop.

One thread runs a selector loop: it accepts connections, reads each request's head and writes each response
without blocking, so no thread ever waits on a client. A request whose head is complete is answered by the WSGI
application, run on in-memory streams (``wsgiref.handlers.SimpleHandler``): in the loop itself for the cheap
paths (``inline``: /healthz and /readyz, never waiting behind a scrape), by a small pool of worker threads for
the others. One request per connection (HTTP/1.0: the connection closes after the response).

Limits: a connection has ``timeout_s`` from its accept to send its whole request head (an idle or slowloris
client is dropped then) and as long again to take its response. At most ``max_connections`` are open: past
that, the oldest connection still sending its request (else the oldest waiting for a worker) is dropped for
the new one, so neither a flood of idle connections nor of requests queued behind slow ones can keep a probe
out. ``close`` stops the loop (which only ever waits in ``select``, a tick at
a time) and closes every socket, whatever the clients do.

Why not ``socketserver.ThreadingMixIn``: a thread per connection blocks on its client; bounding the threads
lets idle clients take every one of them (each until its timeout), and not bounding them lets a flood exhaust
them. Here an idle connection costs a socket and a small buffer, and the threads only ever run the application.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import queue
import selectors
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.handlers import SimpleHandler

import structlog

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

TIMEOUT_S = 5.0  # to send a request head; again to take the response
MAX_CONNECTIONS = 256
WORKERS = 2
MAX_HEAD = 16 * 1024
_TICK_S = 0.25  # the loop's longest wait: deadlines are checked this often

_READING, _WORKING, _WRITING = 0, 1, 2

log = structlog.get_logger("cdcd.metrics")


class _Connection:
    __slots__ = ("address", "deadline", "head", "out", "sock", "state")

    def __init__(self, sock: socket.socket, address: Any, deadline: float) -> None:
        self.sock, self.address, self.deadline = sock, address, deadline
        self.head = bytearray()
        self.out = memoryview(b"")
        self.state = _READING


class HttpServer:
    """Serves ``app`` on ``host``:``port`` (0 picks a free port) from its own threads, until ``close``."""

    def __init__(
        self,
        host: str,
        port: int,
        app: WsgiApp,
        inline: frozenset[str] = frozenset(),
        *,
        timeout_s: float = TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        workers: int = WORKERS,
    ) -> None:
        self.app, self.inline, self.timeout_s, self.max_connections = app, inline, timeout_s, max_connections
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, port), family=family, backlog=128)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._connections: dict[_Connection, None] = {}  # in accept order: the first is the oldest
        self._requests: queue.SimpleQueue[tuple[_Connection, dict[str, Any]] | None] = queue.SimpleQueue()
        self._answers: queue.SimpleQueue[tuple[_Connection, bytes]] = queue.SimpleQueue()
        self._closing = False
        self._closed = False
        self._workers = [
            threading.Thread(target=self._work, name=f"metrics-worker-{i}", daemon=True) for i in range(workers)
        ]
        self._loop = threading.Thread(target=self._run, name="metrics", daemon=True)

    def start(self) -> int:
        """Start serving; the bound port."""
        for worker in self._workers:
            worker.start()
        self._loop.start()
        return self.port

    def close(self) -> None:
        """Stop serving and close every connection; never waits on a client (the loop ends within a tick)."""
        self._closing = True
        self._wake()
        if self._loop.is_alive():
            self._loop.join(timeout=5)
        else:
            self._close_sockets()
        for _ in self._workers:
            self._requests.put(None)

    @property
    def connections(self) -> int:
        return len(self._connections)

    # -- the loop ------------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            next_sweep = time.monotonic() + _TICK_S
            while not self._closing:
                for key, mask in self._selector.select(_TICK_S):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    elif key.data not in self._connections:
                        continue  # dropped earlier in this batch: evicted for a connection accepted in it
                    elif mask & selectors.EVENT_READ:
                        self._read(key.data)
                    else:
                        self._write(key.data)
                self._take_answers()
                now = time.monotonic()
                if now >= next_sweep:
                    self._expire(now)
                    next_sweep = now + _TICK_S
        except Exception:  # a bug here must not leave the port open and silent
            log.exception("metrics server failed")
        finally:
            self._close_sockets()

    def _accept(self) -> None:
        for _ in range(64):  # the rest on the next turn: a flood of connects must not starve the others
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors, a connection reset before it was taken...
                log.warning("metrics server cannot accept a connection", error=str(exc))
                return
            if len(self._connections) >= self.max_connections and not self._evict():
                sock.close()
                continue
            sock.setblocking(False)
            connection = _Connection(sock, address, time.monotonic() + self.timeout_s)
            self._connections[connection] = None
            self._selector.register(sock, selectors.EVENT_READ, connection)

    def _evict(self) -> bool:
        """Drop the oldest connection still sending its request, else the oldest waiting for a worker (requests
        queued behind slow ones must not keep a probe out), to make room; False when every one is being answered."""
        for state in (_READING, _WORKING):
            oldest = next((c for c in self._connections if c.state == state), None)
            if oldest is not None:
                self._drop(oldest)
                return True
        return False

    def _read(self, connection: _Connection) -> None:
        try:
            data = connection.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(connection)
            return
        head = connection.head
        head += data
        end = head.find(b"\r\n\r\n")
        if end < 0:
            if len(head) > MAX_HEAD:
                self._answer(connection, _plain("431 Request Header Fields Too Large"))
            return
        self._selector.unregister(connection.sock)
        connection.state = _WORKING
        environ = _environ(bytes(head[: end + 2]), connection.address, self.port)
        if environ is None:
            self._answer(connection, _plain("400 Bad Request"))
        elif environ["PATH_INFO"] in self.inline:
            self._answer(connection, self._respond(environ))
        else:
            self._requests.put((connection, environ))

    def _answer(self, connection: _Connection, response: bytes) -> None:
        """Start sending ``response``; the connection closes once it is sent."""
        if connection.state == _READING:
            self._selector.unregister(connection.sock)
        connection.state = _WRITING
        connection.out = memoryview(response)
        connection.deadline = time.monotonic() + self.timeout_s
        self._selector.register(connection.sock, selectors.EVENT_WRITE, connection)
        self._write(connection)

    def _write(self, connection: _Connection) -> None:
        try:
            sent = connection.sock.send(connection.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(connection)
            return
        connection.out = connection.out[sent:]
        if not connection.out:
            self._drop(connection)

    def _take_answers(self) -> None:
        while True:
            try:
                connection, response = self._answers.get_nowait()
            except queue.Empty:
                return
            if connection in self._connections:
                self._answer(connection, response)

    def _expire(self, now: float) -> None:
        late = [c for c in self._connections if c.state != _WORKING and c.deadline < now]
        for connection in late:
            self._drop(connection)

    def _drop(self, connection: _Connection) -> None:
        if connection.state != _WORKING:
            self._selector.unregister(connection.sock)
        connection.sock.close()
        del self._connections[connection]

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while self._wake_r.recv(4096):
                pass

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full (the loop is awake already) or closed (the loop is gone)
            self._wake_w.send(b"\0")

    def _close_sockets(self) -> None:
        if self._closed:
            return
        self._closed = True
        for connection in self._connections:
            connection.sock.close()
        self._connections.clear()
        self._selector.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- the application -----------------------------------------------------------------------------------

    def _work(self) -> None:
        while (item := self._requests.get()) is not None:
            connection, environ = item
            if connection.sock.fileno() < 0:
                continue  # dropped while it waited: nobody to answer
            self._answers.put((connection, self._respond(environ)))
            self._wake()

    def _respond(self, environ: dict[str, Any]) -> bytes:
        out = io.BytesIO()
        handler = _Handler(io.BytesIO(), out, io.StringIO(), environ, multithread=True, multiprocess=False)
        handler.os_environ = {}  # wsgiref's default copies the process's environment (secrets) into each request
        handler.run(self.app)
        return out.getvalue()


class _Handler(SimpleHandler):
    def log_exception(self, exc_info: Any) -> None:
        log.error("metrics request failed", exc_info=exc_info)


def _environ(head: bytes, address: Any, port: int) -> dict[str, Any] | None:
    """The WSGI environ of a request head (its request line and header lines); None when it is malformed."""
    line, _, rest = head.partition(b"\r\n")
    parts = line.decode("latin-1").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    method, target, version = parts
    try:
        headers = http.client.parse_headers(io.BytesIO(rest + b"\r\n"))
    except http.client.HTTPException:
        return None
    path, _, query = target.partition("?")
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method,
        "SCRIPT_NAME": "",
        "PATH_INFO": urllib.parse.unquote(path, "latin-1"),
        "QUERY_STRING": query,
        "SERVER_PROTOCOL": version,
        "SERVER_NAME": "cdcd",
        "SERVER_PORT": str(port),
        "REMOTE_ADDR": address[0] if isinstance(address, tuple) else "",
    }
    for name, value in headers.items():
        key = name.upper().replace("-", "_")
        if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            key = "HTTP_" + key
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    return environ


def _plain(status: str) -> bytes:
    body = status.encode() + b"\n"
    return (
        f"HTTP/1.0 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
