"""The fault-injecting proxy of tests/support/faultproxy.py: each fault does what it says,
against an echo server (TCP) and a recording HTTP/1.1 server (HTTP), in-process and as its
own process driven through the control endpoint."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.faultproxy import FaultProxy, ProxyControl, Rule

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """A TCP server that echoes every byte back."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # the proxy resets it
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()
    server.close()


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, bytes]] = []

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                out += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
            return out
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def _answer(self) -> None:
        body = self._body()
        self.seen.append((self.command, self.path, body))
        reply = b"ok:" + body
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    do_GET = do_PUT = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: no line per request on stderr."""


@pytest.fixture
def recorder() -> Iterator[tuple[tuple[str, int], list[tuple[str, str, bytes]]]]:
    seen: list[tuple[str, str, bytes]] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield (server.server_address[0], server.server_address[1]), seen  # type: ignore[misc]
    server.shutdown()
    server.server_close()


def _round_trip(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        got = b""
        while len(got) < len(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def test_tcp_forwards_and_adds_latency(echo: tuple[str, int]) -> None:
    with FaultProxy(echo) as proxy:
        assert _round_trip(proxy.port, b"hello") == b"hello"
        proxy.configure(latency=0.15)
        started = time.monotonic()
        assert _round_trip(proxy.port, b"slow") == b"slow"
        assert time.monotonic() - started >= 0.3  # paid once each way
        assert proxy.stats()["connections"] == 2


def test_tcp_bandwidth_throttles(echo: tuple[str, int]) -> None:
    with FaultProxy(echo) as proxy:
        proxy.configure(bandwidth=400_000)
        started = time.monotonic()
        assert _round_trip(proxy.port, b"x" * 100_000, timeout=10) == b"x" * 100_000
        assert time.monotonic() - started >= 0.25  # 100 kB at 400 kB/s (the directions overlap)


def test_tcp_reset_after_bytes(echo: tuple[str, int]) -> None:
    with FaultProxy(echo) as proxy:
        proxy.configure(reset_after=10)
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
            sock.sendall(b"0123456789abcdef")
            got = b""
            with pytest.raises(ConnectionResetError):
                while chunk := sock.recv(100):
                    got += chunk
        assert got == b""  # the 10 bytes reached the server; its echo crossed the limit
        assert proxy.stats()["resets"] == 1


def test_tcp_refuse_and_blackhole_then_heal(echo: tuple[str, int]) -> None:
    with FaultProxy(echo) as proxy:
        proxy.configure(refuse=True)
        time.sleep(0.3)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=2).close()
        proxy.configure(refuse=False, blackhole=True)
        time.sleep(0.3)
        with pytest.raises(TimeoutError):
            _round_trip(proxy.port, b"lost", timeout=0.5)
        proxy.heal()
        assert _round_trip(proxy.port, b"back") == b"back"  # same port again


def _request(
    conn: http.client.HTTPConnection, method: str, path: str, body: bytes = b""
) -> tuple[int, bytes]:
    conn.request(method, path, body=body)
    response = conn.getresponse()
    return response.status, response.read()


def test_http_errors_for_matching_requests_on_one_keep_alive_connection(
    recorder: tuple[tuple[str, int], list[tuple[str, str, bytes]]],
) -> None:
    upstream, seen = recorder
    with FaultProxy(upstream, mode="http") as proxy:
        rule = proxy.add_rule(Rule("error", method="PUT", path=r"/_delta_log/", status=503, times=2))
        proxy.add_rule(Rule("error", method="GET", path=r"^/boom", status=500))
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
        first = _request(conn, "PUT", "/b/t/_delta_log/0.json", b"{}")
        assert first[0] == 503 and b"<Code>SlowDown</Code>" in first[1]
        assert _request(conn, "PUT", "/b/t/_delta_log/0.json", b"{}")[0] == 503
        assert _request(conn, "PUT", "/b/t/_delta_log/0.json", b"{}") == (200, b"ok:{}")  # times=2
        status, body = _request(conn, "GET", "/boom")
        assert status == 500 and b"<Code>InternalError</Code>" in body
        assert _request(conn, "PUT", "/b/t/data.parquet", b"d") == (200, b"ok:d")
        conn.close()
        assert seen == [("PUT", "/b/t/_delta_log/0.json", b"{}"), ("PUT", "/b/t/data.parquet", b"d")]
        assert rule.fired == 2 and proxy.stats()["requests"] == 5
        assert proxy.stats()["statuses"] == {"200": 2}  # the server's answers only


def test_http_rate_is_a_fraction_of_matches(
    recorder: tuple[tuple[str, int], list[tuple[str, str, bytes]]],
) -> None:
    upstream, seen = recorder
    with FaultProxy(upstream, mode="http", seed=7) as proxy:
        proxy.add_rule(Rule("error", rate=0.3, status=500))
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
        statuses = [_request(conn, "GET", f"/k{i}")[0] for i in range(200)]
        conn.close()
        assert 30 <= statuses.count(500) <= 90
        assert len(seen) == statuses.count(200)


def test_http_chunked_body_and_expect_continue_are_forwarded(
    recorder: tuple[tuple[str, int], list[tuple[str, str, bytes]]],
) -> None:
    upstream, seen = recorder
    with FaultProxy(upstream, mode="http") as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
        conn.request("PUT", "/chunked", body=iter([b"abc", b"defg"]), encode_chunked=True)
        assert conn.getresponse().read() == b"ok:abcdefg"
        conn.putrequest("PUT", "/expect")
        conn.putheader("Content-Length", "2")
        conn.putheader("Expect", "100-continue")
        conn.endheaders()
        conn.send(b"hi")
        assert conn.getresponse().read() == b"ok:hi"
        conn.close()
    assert [(m, p, b) for m, p, b in seen] == [("PUT", "/chunked", b"abcdefg"), ("PUT", "/expect", b"hi")]


def test_http_drop_response_lands_the_request_and_resets_the_client(
    recorder: tuple[tuple[str, int], list[tuple[str, str, bytes]]],
) -> None:
    upstream, seen = recorder
    with FaultProxy(upstream, mode="http") as proxy:
        answered: list[str] = []
        proxy.add_rule(
            Rule(
                "drop_response",
                method="PUT",
                times=1,
                when="response",
                on_match=lambda r: answered.append(r.target),
            )
        )
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
        with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected)):
            _request(conn, "PUT", "/landed", b"v1")
        assert seen == [("PUT", "/landed", b"v1")] and answered == ["/landed"]
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
        assert _request(conn, "PUT", "/again", b"v2") == (200, b"ok:v2")
        conn.close()


def test_http_reset_mid_request_never_reaches_the_server(
    recorder: tuple[tuple[str, int], list[tuple[str, str, bytes]]],
) -> None:
    upstream, seen = recorder
    with FaultProxy(upstream, mode="http") as proxy:
        proxy.add_rule(Rule("reset_request", after_bytes=20, times=1))
        proxy.add_rule(Rule("reset_response", path="half", after_bytes=12))
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
        with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected)):
            _request(conn, "PUT", "/never", b"x" * 100)
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
        with pytest.raises((ConnectionResetError, http.client.HTTPException)):
            _request(conn, "GET", "/half")
        time.sleep(0.2)
        assert [p for _, p, _ in seen] == ["/half"]  # the cut request was never handled


def test_process_mode_is_driven_through_the_control_endpoint(
    recorder: tuple[tuple[str, int], list[tuple[str, str, bytes]]],
) -> None:
    (host, port), seen = recorder
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.faultproxy", "--upstream", f"{host}:{port}", "--mode", "http"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        control = ProxyControl(ready["control"])
        conn = http.client.HTTPConnection("127.0.0.1", ready["port"], timeout=5)
        assert _request(conn, "GET", "/a") == (200, b"ok:")
        control.apply(rules=[Rule("error", status=500, times=1), Rule("delay", delay=0.3)])
        assert _request(conn, "GET", "/b")[0] == 500
        started = time.monotonic()
        assert _request(conn, "GET", "/c") == (200, b"ok:")
        assert time.monotonic() - started >= 0.3
        assert control.stats()["fired"] == [1, 1]
        control.apply()  # healed
        assert control.faults()["rules"] == []
        assert _request(conn, "GET", "/d") == (200, b"ok:")
        conn.close()
        assert [p for _, p, _ in seen] == ["/a", "/c", "/d"]
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
