"""Checkpoint ownership: one running streaming query per checkpoint location.

Two running queries that share a checkpoint location would both write every batch (the
engine's own checkpoint checks catch only some interleavings, and only after work was
done). Before any batch runs, the query takes a *lease* named after its checkpoint
location (:func:`lease_name`) from the table's slot store (:meth:`lockstore.SlotStore
.acquire_lease`): with ZooKeeper slots an ephemeral znode, with the embedded local-file
store an ``flock`` that dies with its process. A query that finds the lease held by a live
owner fails with :class:`~eventlog.errors.ConcurrentTransactionException`, whose message
says that several streaming queries are using the same checkpoint and names the owner
(query id, run id, host, pid) - see :func:`checkpoint_in_use`. The sink's commit-time
check (:mod:`streaming.sink`: another run wrote the query's app id) stays as the backstop.

Who holds the lease, and for how long:

* An engine whose driver process lives exactly as long as the query holds the :class:`
  lockstore.Lease` itself: :func:`acquire_checkpoint` at query start, ``release()`` at the
  end (or the process dies and the lease with it).
* Spark gives a Python data source no such process: ``streamWriter()`` runs in pooled
  Python workers that Spark reuses, idles out or kills independently of the query (see
  :mod:`spark_adapter.stream_writer`). There the lease is held by a small *holder process*
  that :func:`claim_checkpoint` starts (detached, importing only :mod:`lockstore`) and
  that lives as long as a process it watches: the Spark driver (JVM). The lease therefore
  belongs to the *application* that runs the query, not to one run of it: another run of
  the query in the same application (a restart after a failure or ``stop()``) finds the
  lease held by its own application and goes on; another application is refused until the
  first one exits (SIGKILL included: the holder notices within half a second, or dies with
  it). Each batch checks the owner again when it is planned and when it commits
  (:func:`verify_checkpoint`).

Limits, honestly: a lease proves that its holder process lives, not that the query still
runs: an application that stopped the query but keeps running holds the checkpoint until
it exits. The run id is not known when the lease is taken (Spark tells it to tasks only),
so the owner record names the query, its application and its driver; the error adds the
run id of the owner's latest committed batch when the table has one. Local-file leases
are per machine (flock), in-memory leases per process; use ZooKeeper slots for queries on
several machines. Liveness of the watched process is checked by pid plus start time
(``/proc``; elsewhere by pid alone).

This module imports :mod:`lockstore` and the standard library at import time, and
:mod:`eventlog` only inside the functions that build errors: the holder process runs it as
a standalone file and must stay small.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lockstore import (
    Lease,
    LeaseHeldError,
    LeaseOwner,
    LocalFileSlotStore,
    ObjectStoreSlotStore,
    SlotStore,
    lease_owner_here,
)

if TYPE_CHECKING:
    from eventlog.errors import ConcurrentTransactionException

__all__ = [
    "LEASE_PREFIX",
    "StoreLocator",
    "acquire_checkpoint",
    "checkpoint_in_use",
    "claim_checkpoint",
    "lease_name",
    "process_start_token",
    "process_alive",
    "verify_checkpoint",
]

log = logging.getLogger("streaming.ownership")

LEASE_PREFIX = "eventlog-streaming-checkpoint:"
HOLDER_POLL_SECONDS = 0.5
_HANDSHAKE_SECONDS = 60.0

# Runs ownership.py as a standalone module (not through the ``streaming`` package, whose
# imports are heavy), with the spawner's sys.path. Inside a zip (code shipped to a Spark
# cluster with pyFiles) the file cannot be loaded by path: it is imported by name there.
_BOOT = (
    "import json, os, sys, importlib, importlib.util as u\n"
    "a = json.loads(sys.argv[2]); sys.path[:0] = a['sys_path']\n"
    "if os.path.isfile(sys.argv[1]):\n"
    "    s = u.spec_from_file_location('_eventlog_lease_holder', sys.argv[1])\n"
    "    m = u.module_from_spec(s); sys.modules[s.name] = m; s.loader.exec_module(m)\n"
    "else:\n"
    "    m = importlib.import_module('streaming.ownership')\n"
    "m._holder_main(a)\n"
)


def lease_name(checkpoint: str) -> str:
    """The lease name of a checkpoint location: local paths made absolute and normalised
    (``file:`` URIs included), other URIs as given without a trailing ``/``."""
    location = checkpoint.strip()
    if location.startswith("file:"):
        location = location[len("file:") :]
        while location.startswith("//"):
            location = location[1:]
    if "://" not in location:
        location = os.path.normpath(os.path.abspath(location))
    else:
        location = location.rstrip("/")
    return LEASE_PREFIX + location


# --------------------------------------------------------------------------- errors


def checkpoint_in_use(
    checkpoint: str, owner: LeaseOwner, *, table: str, run_hint: str | None = None
) -> ConcurrentTransactionException:
    """The error of a query that found its checkpoint held by another live query."""
    from eventlog.errors import ConcurrentTransactionException

    info = dict(owner.info)
    query = info.get("queryId") or "unknown"
    run = info.get("runId") or run_hint or "unknown (no batch committed yet)"
    driver = info.get("driverPid")
    since = ""
    if owner.acquired_ms:
        since = " since " + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(owner.acquired_ms / 1000))
    detail = (
        "ConcurrentTransactionException: several streaming queries are using the same checkpoint "
        f"{checkpoint} to write into this table. It is held{since} by query {query}, run {run}, "
        f"on host {owner.host}, pid {owner.pid}"
        + (f" (driver pid {driver})" if driver else "")
        + ". Stop that query (a Spark application keeps the checkpoint until it exits) or give "
        "this query its own checkpoint location; no batch of this query was processed."
    )
    return ConcurrentTransactionException(
        f"[DELTA_CONCURRENT_TRANSACTION] {detail}",
        winning_version=-1,
        operation="STREAMING UPDATE",
        winning_commit_info={"checkpointLease": owner.to_dict()},
        table=table,
        detail=detail,
    )


# --------------------------------------------------------------------------- in-process leases


def acquire_checkpoint(
    store: SlotStore,
    checkpoint: str,
    *,
    query_id: str,
    run_id: str,
    table: str,
    info: Mapping[str, str] | None = None,
    run_hint: Callable[[LeaseOwner], str | None] | None = None,
) -> Lease:
    """Take the checkpoint's lease for this process, for as long as the query runs.

    Raises :class:`ConcurrentTransactionException` naming the live owner if another query
    holds it. The caller keeps the returned lease (and ``store`` open) until the query
    ends, then releases it; if the process dies, the lease ends with it.
    """
    owner = lease_owner_here(
        queryId=query_id, runId=run_id, checkpoint=checkpoint, table=table, **dict(info or {})
    )
    try:
        return store.acquire_lease(lease_name(checkpoint), owner)
    except LeaseHeldError as exc:
        hint = run_hint(exc.owner) if run_hint is not None else None
        raise checkpoint_in_use(checkpoint, exc.owner, table=table, run_hint=hint) from None


def verify_checkpoint(
    store: SlotStore,
    checkpoint: str,
    *,
    app: str,
    table: str,
    run_hint: Callable[[LeaseOwner], str | None] | None = None,
) -> LeaseOwner | None:
    """Check at a batch that the checkpoint's lease is held by application ``app``.

    Returns the owner, or None when nobody holds the lease (its holder died: the caller
    may claim it again; the sink's commit-time check still applies). Raises
    :class:`ConcurrentTransactionException` when another application holds it.
    """
    owner = store.lease_owner(lease_name(checkpoint))
    if owner is None or owner.info.get("app") == app:
        return owner
    hint = run_hint(owner) if run_hint is not None else None
    raise checkpoint_in_use(checkpoint, owner, table=table, run_hint=hint)


# --------------------------------------------------------------------------- holder processes


@dataclass(frozen=True)
class StoreLocator:
    """How another process opens the same slot store: a local-file store's root, or a spec
    (``zk://...``, ``s3://...``) for :func:`lockstore.registry.open_slot_store`, with the
    object store's ``storage_options`` as JSON (never in a repr; a holder process gets
    them on its stdin, not on its command line, where ``ps`` would show them)."""

    kind: str  # "localfs" | "spec"
    value: str
    options: str = field(default="", repr=False)  # JSON of the file system's options

    @staticmethod
    def of(store: SlotStore, spec: str | None) -> StoreLocator | None:
        """The locator of ``store`` (opened from ``spec``, if any); None for stores another
        process cannot share (in-memory, or an object store the registry cannot open)."""
        if isinstance(store, LocalFileSlotStore):
            return StoreLocator("localfs", store.root)
        if isinstance(store, ObjectStoreSlotStore):
            protocol = store.filesystem.protocol
            scheme = protocol if isinstance(protocol, str) else protocol[0]
            if scheme not in ("s3", "s3a"):
                return None
            tuning = f"lease_ttl={store.lease_ttl:g}&poll_interval={store.poll_interval:g}"
            options = json.dumps(dict(store.filesystem.storage_options), sort_keys=True, default=str)
            return StoreLocator("spec", f"s3://{store.root}?{tuning}", options)
        if spec and not spec.startswith("memory:"):
            return StoreLocator("spec", spec)
        return None

    def open(self) -> SlotStore:
        if self.kind == "localfs":
            return LocalFileSlotStore(self.value)
        from lockstore.registry import open_slot_store

        options = json.loads(self.options) if self.options else None
        return open_slot_store(self.value, shared=False, storage_options=options)


def process_start_token(pid: int) -> str | None:
    """A token that tells process ``pid`` apart from a later process reusing its pid (its
    start time in clock ticks since boot, from ``/proc``); None where ``/proc`` is missing."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
        return stat[stat.rindex(")") + 2 :].split()[19]
    except (OSError, ValueError, IndexError):
        return None


def process_alive(pid: int, token: str | None) -> bool:
    """Whether process ``pid`` (started as ``token`` says, if given) still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        ...  # it exists (another user's process): check its start token below
    if token is None:
        return True
    current = process_start_token(pid)
    return current is None or current == token


def claim_checkpoint(
    store: SlotStore,
    locator: StoreLocator,
    checkpoint: str,
    *,
    app: str,
    table: str,
    watch_pid: int,
    watch_token: str | None,
    info: Mapping[str, str] | None = None,
    run_hint: Callable[[LeaseOwner], str | None] | None = None,
    timeout: float = _HANDSHAKE_SECONDS,
) -> LeaseOwner:
    """Make sure application ``app`` holds the checkpoint's lease; returns the owner record.

    If ``app`` holds it already, nothing happens. If nobody does, a holder process is
    started that takes the lease and keeps it until the process ``watch_pid`` (started as
    ``watch_token``) ends, the lease is lost, or the holder gets SIGTERM. If another
    application holds it, :class:`ConcurrentTransactionException` names the owner.
    ``info`` (e.g. ``queryId``) is stored in the owner record with ``app``.
    """
    name = lease_name(checkpoint)
    owner = store.lease_owner(name)
    if owner is not None:
        if owner.info.get("app") == app:
            return owner
        raise checkpoint_in_use(
            checkpoint, owner, table=table, run_hint=run_hint(owner) if run_hint is not None else None
        )
    record = {**dict(info or {}), "app": app, "checkpoint": checkpoint, "table": table}
    report = _spawn_holder(locator, name, record, watch_pid, watch_token, timeout)
    status = report.get("status")
    found = LeaseOwner.from_dict(report["owner"]) if report.get("owner") else None
    if status == "held" and found is not None:
        log.info("checkpoint %s: lease taken by holder pid %d for %s", checkpoint, found.pid, app)
        return found
    if status == "taken" and found is not None:
        if found.info.get("app") == app:  # our own application won a race with itself
            return found
        raise checkpoint_in_use(
            checkpoint, found, table=table, run_hint=run_hint(found) if run_hint is not None else None
        )
    raise RuntimeError(f"checkpoint {checkpoint}: the lease holder failed: {report.get('error', report)}")


def _spawn_holder(
    locator: StoreLocator,
    name: str,
    info: Mapping[str, str],
    watch_pid: int,
    watch_token: str | None,
    timeout: float,
) -> dict[str, Any]:
    """Start a detached holder (a double fork: it is nobody's child to reap) and read its
    one-line JSON report: ``{"status": "held"|"taken"|"error", "owner": ..., "error": ...}``."""
    args = {
        "sys_path": [p for p in sys.path if p],
        "kind": locator.kind,
        "value": locator.value,
        "name": name,
        "info": dict(info),
        "watch_pid": watch_pid,
        "watch_token": watch_token,
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", _BOOT, os.path.abspath(__file__), json.dumps(args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        close_fds=True,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.write(locator.options.encode("utf-8"))  # secrets: not on the command line
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.close()
    deadline = time.monotonic() + timeout
    line = b""
    try:
        fd = proc.stdout.fileno()
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                return {"status": "error", "error": f"no answer from the lease holder within {timeout:g} s"}
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            line += chunk
    finally:
        proc.stdout.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    try:
        report: dict[str, Any] = json.loads(line.decode("utf-8"))
    except ValueError:
        return {"status": "error", "error": f"the lease holder exited without a report ({line[:200]!r})"}
    return report


def _holder_main(args: Mapping[str, Any]) -> None:
    """The holder process: take the lease, report on stdout, hold it while the watched
    process lives. Runs with only :mod:`lockstore` and the standard library imported."""
    options = sys.stdin.read()  # the store's options (:class:`StoreLocator`), before the fork
    if os.fork():
        os._exit(0)  # the spawner reaps this intermediate; the holder is reparented
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    store: SlotStore | None = None
    lease: Lease | None = None
    try:
        store = StoreLocator(str(args["kind"]), str(args["value"]), options).open()
        owner = LeaseOwner(socket.gethostname(), os.getpid(), dict(args["info"]), 0)
        try:
            lease = store.acquire_lease(str(args["name"]), owner)
            report: dict[str, Any] = {"status": "held", "owner": lease.owner.to_dict()}
        except LeaseHeldError as exc:
            report = {"status": "taken", "owner": exc.owner.to_dict()}
    except BaseException as exc:
        report = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    _report(report)
    try:
        if lease is not None:
            pid, token = int(args["watch_pid"]), args.get("watch_token")
            while not stop.wait(HOLDER_POLL_SECONDS):
                if not process_alive(pid, token) or not lease.held:
                    break
    finally:
        with contextlib.suppress(Exception):
            if lease is not None:
                lease.release()
        with contextlib.suppress(Exception):
            if store is not None:
                store.close()
    os._exit(0)


def _report(report: Mapping[str, Any]) -> None:
    data = (json.dumps(report) + "\n").encode("utf-8")
    with contextlib.suppress(OSError):
        os.write(1, data)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            os.dup2(devnull, fd)
    os.close(devnull)
