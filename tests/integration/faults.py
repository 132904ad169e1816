"""A client of Toxiproxy's HTTP API, for fault-injection tests (standard library only).

The stack's ``toxiproxy`` (deploy/local/README.md#toxiproxy) runs proxies in front of each PostgreSQL major, the
schema registry and Kafka; ``stack env`` exports their addresses (``STACK_TOXIPROXY_*``). A fault is a toxic on a
proxy (latency, a blackhole, resets, ...) or the proxy disabled (new connections refused, open ones closed)::

    toxiproxy = Toxiproxy(env["STACK_TOXIPROXY_URL"])
    with toxiproxy.fault("pg15", latency(500)):
        ...                                   # every answer of PostgreSQL 15 through the proxy 0.5 s late
    with toxiproxy.down("kafka", lasting=3):
        ...                                   # the Kafka proxy refuses connections for 3 s

The stack's proxies are shared by everyone's tests. A test that needs no fixed address makes a proxy of its own
(``temporary_proxy``, on a free port); the Kafka proxy cannot be private (the broker advertises its address), so
a test that faults it holds ``exclusive("kafka")`` meanwhile.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

Stream = Literal["upstream", "downstream"]  # upstream: client -> server; downstream: server -> client


class ToxiproxyError(Exception):
    """Toxiproxy answered with an error status (e.g. 404: no such proxy, 409: it exists already)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"toxiproxy: HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True)
class Fault:
    """A toxic to add: its type, its attributes, the direction it acts on and the share of connections it hits."""

    type: str
    attributes: Mapping[str, int] = field(default_factory=dict)
    stream: Stream = "downstream"
    toxicity: float = 1.0


def latency(ms: int, jitter_ms: int = 0, stream: Stream = "downstream") -> Fault:
    """Data is delayed by ``ms`` (± ``jitter_ms``)."""
    return Fault("latency", {"latency": ms, "jitter": jitter_ms}, stream)


def bandwidth(kb_per_s: int, stream: Stream = "downstream") -> Fault:
    """Data flows at ``kb_per_s`` KB/s at most."""
    return Fault("bandwidth", {"rate": kb_per_s}, stream)


def timeout(ms: int = 0, stream: Stream = "downstream") -> Fault:
    """A blackhole: data is dropped, and the connection closed after ``ms`` (0: never; removing the toxic closes
    the connections it held)."""
    return Fault("timeout", {"timeout": ms}, stream)


def reset_peer(ms: int = 0, stream: Stream = "downstream") -> Fault:
    """Connections are reset (TCP RST) ``ms`` after data arrives."""
    return Fault("reset_peer", {"timeout": ms}, stream)


def slicer(average_size: int, size_variation: int = 0, delay_us: int = 0, stream: Stream = "downstream") -> Fault:
    """Data is cut into pieces of ``average_size`` ± ``size_variation`` bytes, ``delay_us`` µs apart."""
    attributes = {"average_size": average_size, "size_variation": size_variation, "delay": delay_us}
    return Fault("slicer", attributes, stream)


def limit_data(max_bytes: int, stream: Stream = "downstream") -> Fault:
    """A connection is closed once ``max_bytes`` have gone through it."""
    return Fault("limit_data", {"bytes": max_bytes}, stream)


@dataclass(frozen=True)
class Toxic:
    """A toxic on a proxy, as Toxiproxy reports it."""

    name: str
    type: str
    stream: Stream
    toxicity: float
    attributes: Mapping[str, int]

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> Toxic:
        return cls(data["name"], data["type"], data["stream"], float(data["toxicity"]), dict(data["attributes"]))


@dataclass(frozen=True)
class Proxy:
    """A proxy: where it listens, where it forwards to, whether it is enabled, and its toxics."""

    name: str
    listen: str  # host:port
    upstream: str
    enabled: bool
    toxics: tuple[Toxic, ...]

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> Proxy:
        toxics = tuple(Toxic.parse(t) for t in data.get("toxics") or ())
        return cls(data["name"], data["listen"], data["upstream"], bool(data["enabled"]), toxics)

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])


class Toxiproxy:
    """Toxiproxy's API at ``url`` (e.g. ``http://127.0.0.1:18474``)."""

    def __init__(self, url: str, timeout: float = 10) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: object = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as e:
            raise ToxiproxyError(e.code, _error_message(e.read())) from None
        return json.loads(payload) if payload.strip() else None

    @staticmethod
    def _path(*parts: str) -> str:
        return "".join("/" + urllib.parse.quote(p, safe="") for p in parts)

    def version(self) -> str:
        request = urllib.request.Request(self.url + "/version")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return cast(bytes, response.read()).decode().strip()

    def proxies(self) -> dict[str, Proxy]:
        return {name: Proxy.parse(p) for name, p in self._call("GET", "/proxies").items()}

    def proxy(self, name: str) -> Proxy:
        return Proxy.parse(self._call("GET", self._path("proxies", name)))

    def create(self, name: str, upstream: str, listen: str = "127.0.0.1:0", enabled: bool = True) -> Proxy:
        """A new proxy (port 0: a free one, see ``Proxy.listen``); ToxiproxyError 409 if the name is taken."""
        body = {"name": name, "listen": listen, "upstream": upstream, "enabled": enabled}
        return Proxy.parse(self._call("POST", "/proxies", body))

    def delete(self, name: str) -> None:
        self._call("DELETE", self._path("proxies", name))

    def reset(self) -> None:
        """Every proxy enabled and every toxic removed, everyone's: for a Toxiproxy of one's own."""
        self._call("POST", "/reset")

    def set_enabled(self, name: str, enabled: bool) -> Proxy:
        """Disabled: the proxy stops listening and closes its connections; enabled: it listens again."""
        return Proxy.parse(self._call("POST", self._path("proxies", name), {"enabled": enabled}))

    def disable(self, name: str) -> Proxy:
        return self.set_enabled(name, False)

    def enable(self, name: str) -> Proxy:
        return self.set_enabled(name, True)

    def toxics(self, proxy: str) -> list[Toxic]:
        return [Toxic.parse(t) for t in self._call("GET", self._path("proxies", proxy, "toxics"))]

    def add(self, proxy: str, fault: Fault, name: str | None = None) -> Toxic:
        """Adds the toxic (named ``name``, by default ``<type>_<stream>``); ToxiproxyError 409 if the name is taken."""
        body: dict[str, object] = {
            "type": fault.type,
            "stream": fault.stream,
            "toxicity": fault.toxicity,
            "attributes": dict(fault.attributes),
        }
        if name is not None:
            body["name"] = name
        return Toxic.parse(self._call("POST", self._path("proxies", proxy, "toxics"), body))

    def remove(self, proxy: str, toxic: str) -> None:
        self._call("DELETE", self._path("proxies", proxy, "toxics", toxic))

    @contextlib.contextmanager
    def fault(self, proxy: str, fault: Fault, lasting: float | None = None, name: str | None = None) -> Iterator[Toxic]:
        """The toxic on ``proxy`` while the block runs, or for ``lasting`` seconds if that ends first."""
        toxic = self.add(proxy, fault, name)
        with _undone_after(lasting, lambda: self._remove_if_there(proxy, toxic.name)):
            yield toxic

    @contextlib.contextmanager
    def down(self, proxy: str, lasting: float | None = None) -> Iterator[None]:
        """``proxy`` disabled while the block runs, or for ``lasting`` seconds if that ends first."""
        self.disable(proxy)
        with _undone_after(lasting, lambda: self.enable(proxy)):
            yield

    @contextlib.contextmanager
    def temporary_proxy(self, name: str, upstream: str, listen: str = "127.0.0.1:0") -> Iterator[Proxy]:
        """A proxy of one's own (on a free port by default), deleted afterwards."""
        proxy = self.create(name, upstream, listen)
        try:
            yield proxy
        finally:
            with contextlib.suppress(ToxiproxyError):
                self.delete(name)

    def _remove_if_there(self, proxy: str, toxic: str) -> None:
        try:
            self.remove(proxy, toxic)
        except ToxiproxyError as e:
            if e.status != 404:
                raise


@contextlib.contextmanager
def _undone_after(seconds: float | None, undo: Callable[[], object]) -> Iterator[None]:
    """Runs ``undo()`` after ``seconds`` (None: never) from a timer, or when the block ends if sooner; once."""
    lock = threading.Lock()
    done = False

    def undo_once() -> None:
        nonlocal done
        with lock:
            if not done:
                done = True
                undo()

    timer = None if seconds is None else threading.Timer(seconds, undo_once)
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
        undo_once()


@contextlib.contextmanager
def exclusive(proxy: str, wait: float = 120) -> Iterator[None]:
    """Holds a lock named after ``proxy`` (a file lock, between processes of this machine), waiting up to ``wait``
    seconds for it: for faults on a shared proxy, which would upset another test faulting it at the same time."""
    path = Path(tempfile.gettempdir()) / f"cdcd-toxiproxy-{proxy}.lock"
    with path.open("a") as handle:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path} still locked after {wait:g} s") from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _error_message(payload: bytes) -> str:
    try:
        return str(json.loads(payload)["error"])
    except (ValueError, KeyError, TypeError):
        return payload.decode(errors="replace").strip()
