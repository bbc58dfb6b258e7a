"""A writer process with its own clock, for the clock-skew fault tests
(tests/faults/test_clock_skew.py): ``python -m tests.faults.skew_writer '<json>'``.

The test starts it under libfaketime (``LD_PRELOAD`` and ``FAKETIME``, see :func:`skewed_env`),
so ``time.time()`` and ``datetime.now()`` run hours ahead or behind while the monotonic
clock and the file systems' and S3 server's timestamps stay true. The JSON names the table
(``uri``, ``slots``, ``storage_options``) and one operation (``op``); the process prints one
JSON line with the outcome (``clock_ms``: its own clock when it ran) and exits.

Operations: ``append`` (``ids``), ``delete`` (``predicate``), ``vacuum``
(``retention_hours``, ``enforce``), ``checkpoint``, ``hold_lease`` (``name``: takes the lease
of the table's slot store, prints ``{"held": ...}`` and beats until killed) and
``acquire_lease`` (``name``, ``wait``: retries until it wins, prints when, on the shared
monotonic clock, and how often it was refused).
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa


def _select_sleep(seconds: float) -> None:
    """``time.sleep`` for processes under libfaketime with a true monotonic clock: Python
    3.11+ sleeps with ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``, which libfaketime
    0.9.10 turns into an invalid request when ``DONT_FAKE_MONOTONIC`` is set (EINVAL;
    wolfcw/libfaketime#426). ``select`` with a relative timeout is not affected."""
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    select.select([], [], [], seconds)


if os.environ.get("DONT_FAKE_MONOTONIC") == "1" and "FAKETIME" in os.environ:
    # Before the engine is imported (in the operations below) and looks it up.
    time.sleep = _select_sleep  # type: ignore[assignment]

FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
SCHEMA = pa.schema([("id", pa.int64())])
REPO = Path(__file__).resolve().parents[2]


def skewed_env(offset: str | None) -> dict[str, str]:
    """The environment of a process whose wall clock is ``offset`` off (libfaketime's
    relative form, e.g. ``"+3h"`` or ``"-3h"``; None: the true clock). ``FAKETIME_NO_CACHE``
    makes every call read the offset afresh; ``DONT_FAKE_MONOTONIC`` keeps the monotonic
    clock true, as a skewed machine's is (timeouts and TTL checks use it; with a faked one,
    waits on a monotonic deadline hang: wolfcw/libfaketime#390). ``time.sleep`` is then
    replaced in the process (:func:`_select_sleep`)."""
    env = dict(os.environ)
    if offset is not None:
        env.update(LD_PRELOAD=FAKETIME_LIB, FAKETIME=offset, FAKETIME_NO_CACHE="1", DONT_FAKE_MONOTONIC="1")
    return env


def read_json_line(proc: Any, timeout: float) -> dict[str, Any]:
    """The next JSON line the child process ``proc`` prints on its stdout (bounded)."""
    assert proc.stdout is not None
    fd, data, deadline = proc.stdout.fileno(), b"", time.monotonic() + timeout
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        assert left > 0, f"no report within {timeout:g} s"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 1)  # one byte at a time: the next line stays in the pipe
            assert chunk, f"the process exited ({proc.wait()}) without a report"
            data += chunk
    return dict(json.loads(data))


def _clock_ms() -> int:
    return int(time.time() * 1000)


def _open(spec: Mapping[str, Any]) -> Any:
    from eventlog import Table

    return Table.open(spec["uri"], slots=spec.get("slots"), storage_options=spec.get("storage_options"))


def _lease_store(spec: Mapping[str, Any]) -> Any:
    from lockstore.registry import open_slot_store

    return open_slot_store(spec["slots"], storage_options=spec.get("storage_options"))


def _emit(record: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps({**record, "clock_ms": _clock_ms()}) + "\n")
    sys.stdout.flush()


def _hold_lease(spec: Mapping[str, Any]) -> None:
    from lockstore import lease_owner_here

    store = _lease_store(spec)
    lease = store.acquire_lease(spec["name"], lease_owner_here(role="holder"))
    _emit({"held": lease.held, "pid": os.getpid()})
    while lease.held:  # beating on its own thread until the test kills this process
        time.sleep(0.1)
    _emit({"lost": True})


def _acquire_lease(spec: Mapping[str, Any]) -> None:
    from lockstore import LeaseHeldError, lease_owner_here

    store = _lease_store(spec)
    deadline = time.monotonic() + float(spec["wait"])
    refused = 0
    while True:
        try:
            lease = store.acquire_lease(spec["name"], lease_owner_here(role="contender"))
        except LeaseHeldError:
            refused += 1
            if time.monotonic() > deadline:
                _emit({"won": False, "refused": refused})
                return
            time.sleep(0.2)
            continue
        _emit({"won": True, "at_monotonic": time.monotonic(), "refused": refused})
        lease.release()
        return


def main(spec: Mapping[str, Any]) -> None:
    op = spec["op"]
    if op == "hold_lease":
        _hold_lease(spec)
        return
    if op == "acquire_lease":
        _acquire_lease(spec)
        return
    with _open(spec) as table:
        if op == "append":
            result = table.append(pa.table({"id": spec["ids"]}, schema=SCHEMA))
            _emit({"version": result.version, "txn": result.txn_id})
        elif op == "delete":
            result = table.delete(spec["predicate"])
            _emit({"version": result.version, "txn": result.txn_id})
        elif op == "vacuum":
            deleted = table.vacuum(spec.get("retention_hours"), enforce_retention=spec.get("enforce", True))
            _emit({"deleted": deleted})
        elif op == "checkpoint":
            _emit({"checkpoint": table.checkpoint()})
        else:
            raise SystemExit(f"unknown op {op!r}")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
