"""The process behind :class:`tests.support.s3server.MotoS3Server`: moto's S3 server.

Run as ``python -P moto_serve.py serve --port N --dir D [...]``; it imports nothing of the
repository (``-P`` keeps ``tests/support`` off its path), only moto.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

LOOPBACK = "127.0.0.1"
_WRITE_METHODS = frozenset({"PUT", "POST", "DELETE"})


def _serialize_writes() -> None:
    """Run moto's handling of each PUT, POST and DELETE under one lock (why: the docstring
    of tests/support/s3server.py)."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    lock = threading.Lock()
    dispatch = DomainDispatcherApplication.__call__

    def call(self: Any, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("REQUEST_METHOD") not in _WRITE_METHODS:
            return dispatch(self, environ, start_response)
        with lock:
            # The handler runs inside the call; materialise the (small) body under the lock too.
            return list(dispatch(self, environ, start_response))

    DomainDispatcherApplication.__call__ = call  # type: ignore[method-assign]


def _serve(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="moto_serve.py serve")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dir", required=True, help="the server's directory (names it for reap_orphans)")
    parser.add_argument("--serialize-writes", action="store_true")
    parser.add_argument("--switch-interval", type=float)
    parser.add_argument("--log-requests", action="store_true")
    args = parser.parse_args(argv)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    if not args.log_requests:
        # werkzeug sets INFO (one line per request) only when the level is still unset.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
    if args.serialize_writes:
        _serialize_writes()
    from moto.server import main

    print(f"serving S3 on http://{LOOPBACK}:{args.port} (pid {os.getpid()})", flush=True)
    main(["--host", LOOPBACK, "--port", str(args.port)])


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "serve":
        sys.exit(f"usage: {sys.argv[0]} serve --port PORT --dir DIR [--serialize-writes]")
    _serve(sys.argv[2:])
