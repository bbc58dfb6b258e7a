"""Prometheus metrics of commits, conflicts, group commits and streaming batches.

Off until enabled; then every table of the process reports into one set of collectors::

    import eventlog.metrics
    eventlog.metrics.enable(port=9464)           # serve /metrics on that port
    eventlog.metrics.enable(registry=my_registry)  # or report into your own registry

``prometheus-client`` is an optional dependency (the ``metrics`` extra); :func:`enable`
says so when it is missing. The collectors:

========================================== ======================================================
``eventlog_commits_total``                 commits, by ``operation``
``eventlog_commit_attempts_total``         version claims tried (one per attempt)
``eventlog_commit_retries_total``          attempts after the first (lost races, outages)
``eventlog_conflicts_total``               commits failed by a conflict, by ``exception`` (Delta's)
``eventlog_commit_phase_seconds``          histogram per ``phase`` of ``CommitResult.timings``
                                           (stage, check, claim, publish, backoff, wait, gather,
                                           total)
``eventlog_group_commit_size``             histogram of the transactions one group commit carries
``eventlog_streaming_batches_total``       micro-batches committed by the streaming sink, by
                                           ``outcome`` (committed, skipped as a replay)
========================================== ======================================================

The hooks (:func:`observe_commit` and the rest) cost one attribute check while disabled.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

__all__ = [
    "disable",
    "enable",
    "enabled",
    "observe_commit",
    "observe_conflict",
    "observe_group_commit",
    "observe_streaming_batch",
]

_PHASE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_GROUP_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


class _Collectors:
    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Histogram

        self.registry = registry
        self.commits = Counter("eventlog_commits", "Commits.", ["operation"], registry=registry)
        self.attempts = Counter("eventlog_commit_attempts", "Version claims tried.", registry=registry)
        self.retries = Counter("eventlog_commit_retries", "Claims after the first.", registry=registry)
        self.conflicts = Counter(
            "eventlog_conflicts", "Commits failed by a conflict.", ["exception"], registry=registry
        )
        self.phases = Histogram(
            "eventlog_commit_phase_seconds",
            "Commit latency per phase.",
            ["phase"],
            buckets=_PHASE_BUCKETS,
            registry=registry,
        )
        self.group_size = Histogram(
            "eventlog_group_commit_size",
            "Transactions per group commit.",
            buckets=_GROUP_BUCKETS,
            registry=registry,
        )
        self.batches = Counter(
            "eventlog_streaming_batches", "Streaming micro-batches.", ["outcome"], registry=registry
        )


_lock = threading.Lock()
_active: _Collectors | None = None
_server: Any = None


def enable(*, port: int | None = None, addr: str = "127.0.0.1", registry: Any = None) -> Any:
    """Start collecting (idempotent); returns the registry used. With ``port``, serve it
    over HTTP at ``addr:port/metrics`` (a daemon thread of prometheus-client)."""
    global _active, _server
    try:
        import prometheus_client
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "eventlog.metrics needs prometheus-client: pip install 'eventlog-tables[metrics]'"
        ) from exc
    with _lock:
        if _active is None:
            registry = registry if registry is not None else prometheus_client.CollectorRegistry()
            _active = _Collectors(registry)
        if port is not None and _server is None:
            _server = prometheus_client.start_http_server(port, addr=addr, registry=_active.registry)
        return _active.registry


def disable() -> None:
    """Stop collecting and serving."""
    global _active, _server
    with _lock:
        if _server is not None:
            server, _thread = _server
            server.shutdown()
            server.server_close()
        _active, _server = None, None


def enabled() -> bool:
    return _active is not None


def observe_commit(operation: str, attempts: int, timings: Mapping[str, float]) -> None:
    collectors = _active
    if collectors is None:
        return
    collectors.commits.labels(operation).inc()
    collectors.attempts.inc(max(attempts, 1))
    if attempts > 1:
        collectors.retries.inc(attempts - 1)
    for phase, ms in timings.items():
        collectors.phases.labels(phase).observe(ms / 1000)


def observe_conflict(exception: BaseException) -> None:
    collectors = _active
    if collectors is not None:
        collectors.conflicts.labels(type(exception).__name__).inc()


def observe_group_commit(members: int) -> None:
    collectors = _active
    if collectors is not None:
        collectors.group_size.observe(members)


def observe_streaming_batch(outcome: str) -> None:
    collectors = _active
    if collectors is not None:
        collectors.batches.labels(outcome).inc()
