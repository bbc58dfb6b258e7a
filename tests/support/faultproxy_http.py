"""The HTTP side of :mod:`tests.support.faultproxy`: requests and responses read off a
keep-alive connection (head, then a ``Content-Length``, chunked or read-to-close body, kept
verbatim to be forwarded), the :class:`Rule` that decides a request's fault, and S3's XML
error answers.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, BinaryIO

__all__ = ["ACTIONS", "Closed", "HttpRequest", "Rule", "read_body", "read_head", "parse_head", "s3_error"]

ACTIONS = frozenset(
    {"forward", "error", "delay", "reset_request", "drop_response", "reset_response", "blackhole"}
)
_S3_ERRORS = {
    500: ("InternalError", "We encountered an internal error. Please try again."),
    503: ("SlowDown", "Please reduce your request rate."),
}
_REASONS = {500: "Internal Server Error", 503: "Service Unavailable"}


@dataclass(frozen=True)
class HttpRequest:
    """A parsed request head: method, target (path and query) and lower-cased headers."""

    method: str
    target: str
    headers: dict[str, str]


@dataclass
class Rule:
    """One HTTP fault (see the module docstring). ``path`` is a regular expression searched
    in the request target; ``method`` None matches any. ``fired`` counts its firings."""

    action: str
    method: str | None = None
    path: str | None = None
    rate: float = 1.0
    skip: int = 0
    times: int | None = None
    status: int = 503
    delay: float = 0.0
    after_bytes: int = 0
    when: str = "request"
    on_match: Callable[[HttpRequest], None] | None = field(default=None, compare=False)
    fired: int = 0
    seen: int = 0

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown action {self.action!r}; one of {sorted(ACTIONS)}")
        if self.action == "error" and self.status not in _S3_ERRORS:
            raise ValueError(f"status must be one of {sorted(_S3_ERRORS)}")
        if self.when not in ("request", "response"):
            raise ValueError("when must be 'request' or 'response'")

    def matches(self, request: HttpRequest) -> bool:
        if self.method is not None and request.method != self.method.upper():
            return False
        return self.path is None or re.search(self.path, request.target) is not None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "on_match"}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Rule:
        names = {f.name for f in fields(cls)} - {"on_match"}
        return cls(**{k: v for k, v in data.items() if k in names})


class Closed(Exception):
    """A peer closed its connection (or it was reset) while a message was read."""


def read_head(reader: BinaryIO) -> bytes | None:
    """A message head up to and including the blank line; None at a clean EOF before it."""
    lines: list[bytes] = []
    while True:
        line = reader.readline(65536)
        if not line:
            if lines:
                raise Closed("EOF inside a message head")
            return None
        lines.append(line)
        if line in (b"\r\n", b"\n") and len(lines) > 1:
            return b"".join(lines)
        if line in (b"\r\n", b"\n"):
            lines.clear()  # stray CRLF between messages


def parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    first, *rest = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in rest:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return first, headers


def _read_exact(reader: BinaryIO, n: int) -> bytes:
    data = reader.read(n)
    if len(data) < n:
        raise Closed(f"EOF after {len(data)} of {n} body bytes")
    return data


def read_body(reader: BinaryIO, headers: dict[str, str], *, until_eof: bool) -> bytes:
    """The raw body bytes (chunked framing kept, to forward them verbatim)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts: list[bytes] = []
        while True:
            size_line = reader.readline(65536)
            if not size_line:
                raise Closed("EOF inside a chunked body")
            parts.append(size_line)
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while True:  # trailers, then the blank line
                    trailer = reader.readline(65536)
                    if not trailer:
                        raise Closed("EOF inside chunked trailers")
                    parts.append(trailer)
                    if trailer in (b"\r\n", b"\n"):
                        return b"".join(parts)
            parts.append(_read_exact(reader, size + 2))
    if "content-length" in headers:
        return _read_exact(reader, int(headers["content-length"]))
    return reader.read() if until_eof else b""


def s3_error(status: int, request: HttpRequest) -> bytes:
    code, message = _S3_ERRORS[status]
    resource = request.target.split("?", 1)[0]
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message><Resource>{resource}</Resource>"
        f"<RequestId>faultproxy-{random.getrandbits(48):012x}</RequestId></Error>"
    ).encode()
    lines = [
        f"HTTP/1.1 {status} {_REASONS[status]}",
        "Content-Type: application/xml",
        f"Content-Length: {len(body)}",
        "x-amz-request-id: faultproxy",
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode()
    return head if request.method == "HEAD" else head + body
