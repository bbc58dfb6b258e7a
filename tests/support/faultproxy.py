"""A fault-injecting TCP proxy: latency, throttling, resets, blackholes and refusals between
processes, and HTTP-aware faults (S3 errors, slow answers, resets mid-request or
mid-response) in front of the suite's S3 server.

The kernel here has no ``tc`` queueing disciplines (netem is refused), so faults come from
this proxy: it listens on a loopback port and forwards every accepted connection to
``upstream`` (``host:port``). Clients are pointed at :attr:`FaultProxy.port` instead of the
server's.

**Running it.** In-process: ``with FaultProxy(("127.0.0.1", 2181)) as proxy:`` serves from
daemon threads of the test (child processes connect to ``proxy.port`` too). As a process:
``python -m tests.support.faultproxy --upstream 127.0.0.1:2181 [--mode tcp|http] [--port N]
[--control-port N] [--seed S]`` prints one JSON line ``{"port": P, "control": URL}`` once it
listens and serves until SIGTERM. Its faults are changed at run time through the control
endpoint (:class:`ProxyControl` is its client): ``GET /faults``, ``PUT /faults`` (a JSON
:meth:`FaultProxy.describe` document, replacing all faults), ``POST /reset`` (reset every
open connection), ``GET /stats``.

**TCP faults** (:class:`TcpFaults`, both modes, set with :meth:`FaultProxy.configure`):

- ``latency`` (+ uniform ``jitter``) seconds added to each chunk forwarded, each direction,
  order kept (a request/response exchange pays it twice);
- ``bandwidth``: bytes per second per direction per connection;
- ``reset_after``: a connection that has forwarded that many bytes (both directions) is
  reset (RST, ``SO_LINGER`` 0) on both sides;
- ``blackhole``: bytes are accepted and dropped, nothing is ever answered (open
  connections too: a partition as the peers see it);
- ``refuse``: the listening socket is closed (new connections get ECONNREFUSED) and open
  connections are reset; turning it off listens again on the same port.

**HTTP faults** (``mode="http"``): the proxy parses each request of a keep-alive connection
(head, then a ``Content-Length`` or chunked body; it answers ``Expect: 100-continue``
itself) and each response, and the first :class:`Rule` that matches a request (method,
regular expression searched in the target, a ``rate`` of matches, after ``skip`` matches, at
most ``times``) decides its fate: ``error`` (the proxy answers itself: 500
``InternalError`` or 503 ``SlowDown`` with S3's XML body; nothing reaches the server),
``delay`` (the answer is held ``delay`` seconds), ``reset_request`` (``after_bytes`` of the
request reach the server, then both sides are reset: the server never completes it),
``drop_response`` (the server handles the request, its answer is discarded and the client
reset: "did my write land?"), ``reset_response`` (``after_bytes`` of the answer reach the
client, then a reset), ``blackhole`` (never answered) or ``forward``. In-process rules may
carry ``on_match``, called in the connection's thread with the request when the rule fires,
``when="request"`` (before forwarding) or ``"response"`` (after the server answered).
:meth:`FaultProxy.stats` counts connections, requests, each rule's firings and the server's
answers by status.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import signal
import socket
import struct
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, BinaryIO, Self

from tests.support.faultproxy_http import (
    Closed,
    HttpRequest,
    Rule,
    parse_head,
    read_body,
    read_head,
    s3_error,
)

__all__ = ["FaultProxy", "HttpRequest", "ProxyControl", "Rule", "TcpFaults"]

LOOPBACK = "127.0.0.1"
_CHUNK = 65536


@dataclass
class TcpFaults:
    """Faults applied to every connection (see the module docstring)."""

    latency: float = 0.0
    jitter: float = 0.0
    bandwidth: float | None = None
    reset_after: int | None = None
    blackhole: bool = False
    refuse: bool = False


def _reset(sock: socket.socket | None) -> None:
    """Close ``sock`` with a TCP RST (SO_LINGER 0) instead of a FIN."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class FaultProxy:
    """A proxy from ``127.0.0.1:port`` to ``upstream`` with injectable faults (module doc).

    ``upstream``: ``(host, port)`` or ``"host:port"``. ``port`` 0 picks a free one. ``mode``:
    ``"tcp"`` (bytes only) or ``"http"`` (HTTP/1.1 requests and :class:`Rule` faults).
    ``seed`` seeds the draws of ``rate`` and ``jitter``.
    """

    def __init__(
        self,
        upstream: tuple[str, int] | str,
        *,
        port: int = 0,
        mode: str = "tcp",
        seed: int | None = None,
        host: str = LOOPBACK,
    ) -> None:
        if mode not in ("tcp", "http"):
            raise ValueError(f"mode must be 'tcp' or 'http', not {mode!r}")
        self.upstream = self._address(upstream)
        self.host = host
        self.port = port
        self.mode = mode
        self.tcp = TcpFaults()
        self.rules: list[Rule] = []
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._listener: socket.socket | None = None
        self._running = False
        self._open: set[socket.socket] = set()
        self._counts: dict[str, int] = {"connections": 0, "requests": 0, "resets": 0}
        self._statuses: dict[str, int] = {}  # the server's answers by status (HTTP mode)
        self._accept_thread: threading.Thread | None = None

    @staticmethod
    def _address(upstream: tuple[str, int] | str) -> tuple[str, int]:
        if isinstance(upstream, str):
            host, _, port = upstream.rpartition(":")
            return host or LOOPBACK, int(port)
        return upstream[0], int(upstream[1])

    # -- life cycle ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(128)
        sock.settimeout(0.1)
        self.port = sock.getsockname()[1]
        self._listener = sock

    def start(self) -> Self:
        self._listen()
        self._running = True
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name="faultproxy-accept", daemon=True
        )
        self._accept_thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and reset every open connection."""
        with self._changed:
            self._running = False
            self._changed.notify_all()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=5)
        self.reset_connections()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults ----------------------------------------------------------------------------

    def configure(self, **settings: Any) -> None:
        """Change TCP faults (keywords of :class:`TcpFaults`); the others stay as they are."""
        with self._changed:
            for name, value in settings.items():
                if not hasattr(self.tcp, name):
                    raise TypeError(f"unknown TCP fault {name!r}")
                setattr(self.tcp, name, value)
            self._changed.notify_all()
        if settings.get("refuse"):
            self.reset_connections()

    def add_rule(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def set_rules(self, rules: list[Rule]) -> None:
        with self._lock:
            self.rules = list(rules)

    def heal(self) -> None:
        """No faults: TCP faults off and no rules (open connections stay open)."""
        with self._changed:
            self.tcp = TcpFaults()
            self.rules = []
            self._changed.notify_all()

    def describe(self) -> dict[str, Any]:
        """The faults in force, as JSON (the control endpoint's document)."""
        with self._lock:
            return {"tcp": asdict(self.tcp), "rules": [r.to_json() for r in self.rules]}

    def apply(self, document: dict[str, Any]) -> None:
        """Replace every fault with those of a :meth:`describe` document."""
        rules = [Rule.from_json(r) for r in document.get("rules", [])]
        with self._changed:
            self.tcp = TcpFaults(**document.get("tcp", {}))
            self.rules = rules
            self._changed.notify_all()
        if self.tcp.refuse:
            self.reset_connections()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._counts, fired=[r.fired for r in self.rules], statuses=dict(self._statuses))

    def reset_connections(self) -> None:
        """Reset (RST) every open connection, both sides."""
        with self._lock:
            sockets = list(self._open)
            self._open.clear()
        for sock in sockets:
            _reset(sock)

    # -- accepting -------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while True:
            with self._changed:
                while self._running and self.tcp.refuse:
                    if self._listener is not None:
                        self._listener.close()
                        self._listener = None
                    self._changed.wait(0.5)
                if not self._running:
                    break
            if self._listener is None:
                try:
                    self._listen()
                except OSError:  # the port is briefly busy: try again
                    time.sleep(0.05)
                    continue
            assert self._listener is not None
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                continue
            client.settimeout(None)
            with self._lock:
                self._open.add(client)
                self._counts["connections"] += 1
            target = self._serve_http if self.mode == "http" else self._serve_tcp
            threading.Thread(target=self._guard, args=(target, client), daemon=True).start()
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def _guard(self, serve: Callable[[socket.socket], None], client: socket.socket) -> None:
        try:
            serve(client)
        except (OSError, Closed, ValueError):
            pass  # a peer went away, or a reset we injected
        finally:
            self._forget(client)
            _reset(client)

    def _forget(self, sock: socket.socket | None) -> None:
        with self._lock:
            self._open.discard(sock)  # type: ignore[arg-type]

    def _connect_upstream(self) -> socket.socket:
        sock = socket.create_connection(self.upstream, timeout=10)
        sock.settimeout(None)
        with self._lock:
            self._open.add(sock)
        return sock

    # -- forwarding bytes ------------------------------------------------------------------

    def _send(self, sock: socket.socket, data: bytes, state: list[int]) -> None:
        """Forward ``data`` with latency, jitter, bandwidth and ``reset_after`` applied;
        ``state`` is the connection's [byte count, reset counted] (both directions)."""
        tcp = self.tcp
        if tcp.blackhole:
            return
        if tcp.latency or tcp.jitter:
            with self._lock:
                wait = tcp.latency + self._rng.uniform(0, tcp.jitter)
            time.sleep(wait)
        if tcp.reset_after is not None and state[0] + len(data) >= tcp.reset_after:
            keep = max(0, tcp.reset_after - state[0])
            if keep:
                sock.sendall(data[:keep])
            state[0] += keep
            with self._lock:
                if not state[1]:  # once per connection, whichever direction crossed first
                    state[1] = 1
                    self._counts["resets"] += 1
            raise Closed("reset_after reached")
        step = len(data) if not tcp.bandwidth else max(1, min(len(data), int(tcp.bandwidth / 20)))
        for offset in range(0, len(data), step):
            piece = data[offset : offset + step]
            if tcp.bandwidth:  # paced before sending: the last byte is late too
                time.sleep(len(piece) / tcp.bandwidth)
            sock.sendall(piece)
        state[0] += len(data)

    def _serve_tcp(self, client: socket.socket) -> None:
        if self.tcp.blackhole:
            upstream = None
        else:
            upstream = self._connect_upstream()
        state = [0, 0]
        done = threading.Event()

        def pump(src: socket.socket, dst: socket.socket | None) -> None:
            # A reset or closed socket (either side, or a fault of ours) ends this direction.
            try:
                with contextlib.suppress(OSError, Closed):
                    while True:
                        data = src.recv(_CHUNK)
                        if not data:
                            break
                        if dst is not None:
                            self._send(dst, data, state)
            finally:
                done.set()

        if upstream is None:
            pump(client, None)  # blackholed from the start: swallow until the client leaves
            return
        back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
        back.start()
        pump(client, upstream)
        done.wait()
        self._forget(upstream)
        _reset(upstream)
        back.join(timeout=5)

    # -- HTTP ------------------------------------------------------------------------------

    def _decide(self, request: HttpRequest) -> Rule | None:
        with self._lock:
            self._counts["requests"] += 1
            for rule in self.rules:
                if not rule.matches(request):
                    continue
                rule.seen += 1
                if rule.seen <= rule.skip or (rule.times is not None and rule.fired >= rule.times):
                    continue
                if rule.rate >= 1.0 or self._rng.random() < rule.rate:
                    rule.fired += 1
                    return rule
        return None

    def _hold(self) -> None:
        """Blackholed: never answer; return when the proxy stops."""
        with self._changed:
            while self._running:
                self._changed.wait(0.5)

    def _serve_http(self, client: socket.socket) -> None:
        reader = client.makefile("rb")
        upstream: socket.socket | None = None
        up_reader: BinaryIO | None = None
        state = [0, 0]
        try:
            while True:
                head = read_head(reader)
                if head is None:
                    return
                first, headers = parse_head(head)
                method, target = first.split(" ")[:2]
                if headers.get("expect", "").lower() == "100-continue":
                    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    head = re.sub(rb"(?im)^expect:[^\r\n]*\r\n", b"", head)
                request = HttpRequest(method.upper(), target, headers)
                message = head + read_body(reader, headers, until_eof=False)
                rule = self._decide(request)
                action = rule.action if rule is not None else "forward"
                if rule is not None and rule.on_match is not None and rule.when == "request":
                    rule.on_match(request)
                if action == "error":
                    assert rule is not None
                    self._send(client, s3_error(rule.status, request), state)
                    continue
                if action == "blackhole" or self.tcp.blackhole:
                    self._hold()
                    return
                if action == "delay":
                    assert rule is not None
                    time.sleep(rule.delay)
                if upstream is None:
                    upstream = self._connect_upstream()
                    up_reader = upstream.makefile("rb")
                assert up_reader is not None
                if action == "reset_request":
                    assert rule is not None
                    upstream.sendall(message[: rule.after_bytes])
                    return  # both sides reset in the finally clauses
                self._send(upstream, message, state)
                answer, close = self._read_response(up_reader, request)
                self._count_status(answer)
                if rule is not None and rule.on_match is not None and rule.when == "response":
                    rule.on_match(request)
                if action == "drop_response":
                    return
                if action == "reset_response":
                    assert rule is not None
                    client.sendall(answer[: rule.after_bytes])
                    return
                self._send(client, answer, state)
                if close:
                    return
        finally:
            if upstream is not None:
                self._forget(upstream)
                _reset(upstream)

    def _count_status(self, answer: bytes) -> None:
        status = answer.split(b" ", 2)[1].decode()
        with self._lock:
            self._statuses[status] = self._statuses.get(status, 0) + 1

    @staticmethod
    def _read_response(up_reader: BinaryIO, request: HttpRequest) -> tuple[bytes, bool]:
        """The upstream's whole answer (interim 1xx ones included) and whether the connection
        closes after it."""
        parts: list[bytes] = []
        while True:
            head = read_head(up_reader)
            if head is None:
                raise Closed("upstream closed before answering")
            first, headers = parse_head(head)
            status = int(first.split(" ")[1])
            parts.append(head)
            if 100 <= status < 200:
                continue
            bodiless = request.method == "HEAD" or status in (204, 304)
            framed = "content-length" in headers or "chunked" in headers.get("transfer-encoding", "")
            if not bodiless:
                parts.append(read_body(up_reader, headers, until_eof=not framed))
            close = headers.get("connection", "").lower() == "close" or first.startswith("HTTP/1.0")
            return b"".join(parts), close or (not bodiless and not framed)


# ---------------------------------------------------------------------------------------------
# Control: the endpoint of a proxy process, and its client.


def _control_server(proxy: FaultProxy, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self, body: dict[str, Any], status: int = 200) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/faults":
                self._reply(proxy.describe())
            elif self.path == "/stats":
                self._reply(proxy.stats())
            else:
                self._reply({"error": "not found"}, 404)

        def do_PUT(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            try:
                proxy.apply(json.loads(self.rfile.read(length) or b"{}"))
            except (ValueError, TypeError) as exc:
                self._reply({"error": str(exc)}, 400)
                return
            self._reply(proxy.describe())

        def do_POST(self) -> None:
            if self.path != "/reset":
                self._reply({"error": "not found"}, 404)
                return
            proxy.reset_connections()
            self._reply({"reset": True})

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: no line per control request on stderr."""

    server = ThreadingHTTPServer((LOOPBACK, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="faultproxy-control", daemon=True).start()
    return server


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ProxyControl:
    """The client of a proxy process's control endpoint (``http://127.0.0.1:PORT``)."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        with _DIRECT.open(request, timeout=self.timeout) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer

    def faults(self) -> dict[str, Any]:
        return self._call("GET", "/faults")

    def apply(self, tcp: dict[str, Any] | None = None, rules: list[Rule] | None = None) -> dict[str, Any]:
        """Replace every fault of the proxy (nothing given: heal it)."""
        return self._call("PUT", "/faults", {"tcp": tcp or {}, "rules": [r.to_json() for r in rules or []]})

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "/stats")

    def reset_connections(self) -> None:
        self._call("POST", "/reset", {})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.faultproxy")
    parser.add_argument("--upstream", required=True, help="host:port to forward to")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mode", choices=("tcp", "http"), default="tcp")
    parser.add_argument("--control-port", type=int, default=0)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--faults", help="initial faults: a JSON document as GET /faults returns")
    args = parser.parse_args(argv)
    proxy = FaultProxy(args.upstream, port=args.port, mode=args.mode, seed=args.seed)
    if args.faults:
        proxy.apply(json.loads(args.faults))
    proxy.start()
    control = _control_server(proxy, args.control_port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    ready = {"port": proxy.port, "control": f"http://{LOOPBACK}:{control.server_address[1]}"}
    print(json.dumps(ready), flush=True)
    stop.wait()
    control.shutdown()
    proxy.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
