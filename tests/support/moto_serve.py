"""The process behind :class:`tests.support.s3server.MotoS3Server`: moto's S3 server.

Run as ``python -P moto_serve.py serve --port N --dir D [...]``; it imports nothing of the
repository (``-P`` keeps ``tests/support`` off its path), only moto.

``--persist DIR`` (implies ``--serialize-writes``) keeps the buckets on disk, so a server
killed and started again on ``DIR`` has them back: after each PUT, POST or DELETE, still
under the write lock and before the answer is sent, every bucket whose objects changed is
written to ``DIR/<bucket>/``: the new objects' bytes as ``blobs/<sha256>`` files (fsynced),
then ``index.json`` (key -> blob, ETag, Last-Modified, metadata) replaced atomically
(written, fsynced, renamed). At start the buckets of ``DIR`` are loaded before the server
listens. So an answered write survives a SIGKILL, and a write killed before its answer is
either whole or absent, as on S3. What it keeps: buckets and the current version of each
object with its metadata and times. What it does not: object versions, multipart uploads in
progress, ACLs, policies and bucket configuration; blobs of deleted objects stay on disk.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import logging
import os
import shutil
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
_WRITE_METHODS = frozenset({"PUT", "POST", "DELETE"})


def _serialize_writes(after_write: Callable[[], None] | None = None) -> None:
    """Run moto's handling of each PUT, POST and DELETE under one lock (why: the docstring
    of tests/support/s3server.py), then ``after_write`` (still under it)."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    lock = threading.Lock()
    dispatch = DomainDispatcherApplication.__call__

    def call(self: Any, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("REQUEST_METHOD") not in _WRITE_METHODS:
            return dispatch(self, environ, start_response)
        with lock:
            # The handler runs inside the call; materialise the (small) body under the lock too.
            # werkzeug sends the status and headers with the first body chunk, after this returns.
            body = list(dispatch(self, environ, start_response))
            if after_write is not None:
                after_write()
            return body

    DomainDispatcherApplication.__call__ = call  # type: ignore[method-assign]


def _backend() -> Any:
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    return s3_backends[DEFAULT_ACCOUNT_ID]["aws"]


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Persistence:
    """The buckets of moto's backend kept in a directory (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.saved: dict[str, dict[str, dict[str, Any]]] = {}  # bucket -> its index on disk

    def load(self) -> None:
        from moto.s3.models import FakeKey

        backend = _backend()
        self.root.mkdir(parents=True, exist_ok=True)
        for index_path in sorted(self.root.glob("*/index.json")):
            name = index_path.parent.name
            index: dict[str, dict[str, Any]] = json.loads(index_path.read_text())
            backend.create_bucket(name, "us-east-1")
            for key_name, entry in index.items():
                value = (index_path.parent / "blobs" / entry["blob"]).read_bytes()
                key: FakeKey = backend.put_object(name, key_name, value, disable_notification=True)
                key.set_metadata(entry["metadata"])
                key.last_modified = dt.datetime.fromisoformat(entry["last_modified"])
            self.saved[name] = index
        print(f"loaded {len(self.saved)} bucket(s) from {self.root}", flush=True)

    def _index(self, name: str, bucket: Any) -> dict[str, dict[str, Any]]:
        from moto.s3.models import FakeKey

        before = self.saved.get(name, {})
        blobs = self.root / name / "blobs"
        index: dict[str, dict[str, Any]] = {}
        for key_name, key in bucket.keys.items():
            if not isinstance(key, FakeKey):
                continue  # a delete marker
            entry: dict[str, Any] = {
                "etag": key.etag,
                "last_modified": key.last_modified.isoformat(),
                "metadata": dict(key.metadata),
            }
            old = before.get(key_name)
            if old is not None and all(old[k] == v for k, v in entry.items()):
                index[key_name] = old
                continue
            value = key.value
            digest = hashlib.sha256(value).hexdigest()
            entry["blob"] = digest
            blob = blobs / digest
            if not blob.exists():
                blobs.mkdir(parents=True, exist_ok=True)
                _write_atomically(blob, value)
            index[key_name] = entry
        return index

    def save(self) -> None:
        """Write every bucket that changed since the last save (called under the write lock)."""
        buckets = dict(_backend().buckets)
        for name, bucket in buckets.items():
            index = self._index(name, bucket)
            if index == self.saved.get(name):
                continue
            directory = self.root / name
            directory.mkdir(parents=True, exist_ok=True)
            blobs = directory / "blobs"
            if blobs.exists():
                _fsync_dir(blobs)
            _write_atomically(directory / "index.json", json.dumps(index).encode())
            _fsync_dir(directory)
            self.saved[name] = index
        for name in set(self.saved) - set(buckets):  # deleted buckets
            shutil.rmtree(self.root / name, ignore_errors=True)
            del self.saved[name]


def _serve(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="moto_serve.py serve")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default=LOOPBACK, help="the address to bind (0.0.0.0: every one)")
    parser.add_argument("--dir", required=True, help="the server's directory (names it for reap_orphans)")
    parser.add_argument("--serialize-writes", action="store_true")
    parser.add_argument("--switch-interval", type=float)
    parser.add_argument("--log-requests", action="store_true")
    parser.add_argument("--persist", help="keep the buckets in this directory (module docstring)")
    args = parser.parse_args(argv)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    if not args.log_requests:
        # werkzeug sets INFO (one line per request) only when the level is still unset.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
    if args.persist:
        persistence = _Persistence(Path(args.persist))
        persistence.load()
        _serialize_writes(persistence.save)
    elif args.serialize_writes:
        _serialize_writes()
    from moto.server import main

    print(f"serving S3 on http://{args.host}:{args.port} (pid {os.getpid()})", flush=True)
    main(["--host", args.host, "--port", str(args.port)])


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "serve":
        sys.exit(
            f"usage: {sys.argv[0]} serve --port PORT [--host ADDRESS] --dir DIR "
            "[--serialize-writes] [--persist DIR]"
        )
    _serve(sys.argv[2:])
