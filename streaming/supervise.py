"""Restart a streaming query when its source table's metadata changes.

A stream over an eventlog table stops with :class:`SourceMetadataChangedError` when the
table's schema, properties or protocol change under it (a running query cannot change its
schema). Restarting it is the fix: the new run resolves the new schema and resumes at the
offset where the old one stopped. :func:`supervise` does that a bounded number of times::

    def start():
        df = spark.readStream.format("eventlog").load(uri)   # load again: the new schema
        return df.writeStream.format("parquet").option("checkpointLocation", cp).start(out)

    query = supervise(start, max_restarts=3)

``start`` must build the query from a fresh ``load()``: a DataFrame keeps the schema it was
loaded with. Any other error, and the metadata-change error after ``max_restarts``
restarts, propagates. Each restart is logged (``streaming.supervise``, WARNING) with
structured fields on the log record: ``event="stream_restart"``, ``query_id``,
``restart``, ``max_restarts``, ``table``, ``version``, ``operation``, ``changed``,
``old_schema``, ``new_schema``. The query is duck-typed (pyspark's ``StreamingQuery`` or
anything with ``awaitTermination``, ``exception``, ``id`` and ``stop``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from streaming.errors import SourceMetadataChangedError, recover

__all__ = ["StreamingQueryLike", "supervise"]

log = logging.getLogger("streaming.supervise")


class StreamingQueryLike(Protocol):
    """What :func:`supervise` needs of a started query (pyspark's ``StreamingQuery`` fits)."""

    @property
    def id(self) -> Any: ...

    def awaitTermination(self, timeout: float | None = None) -> bool | None: ...

    def exception(self) -> BaseException | None: ...

    def stop(self) -> None: ...


Q = TypeVar("Q", bound=StreamingQueryLike)


def supervise(start: Callable[[], Q], max_restarts: int = 3, *, timeout: float | None = None) -> Q:
    """Run ``start()``'s query to its end, restarting it (by calling ``start`` again) each
    time it fails with :class:`SourceMetadataChangedError`, at most ``max_restarts`` times.

    Returns the last query once it terminates without error (e.g. an ``availableNow``
    query, or one stopped by another thread). ``timeout`` (seconds, over all runs): return
    the running query when it passes; it is still active. Raises the query's error when it
    is not a metadata change or when the restarts are used up.
    """
    if max_restarts < 0:
        raise ValueError(f"max_restarts must not be negative, got {max_restarts}")
    deadline = None if timeout is None else time.monotonic() + timeout
    restarts = 0
    while True:
        query = start()
        error = _wait(query, deadline)
        if error is None:
            return query
        change = recover(error)
        if not isinstance(change, SourceMetadataChangedError) or restarts >= max_restarts:
            raise error
        _stop_quietly(query)
        restarts += 1
        fields = {
            "event": "stream_restart",
            "query_id": str(query.id),
            "restart": restarts,
            "max_restarts": max_restarts,
            "table": change.uri,
            "version": change.version,
            "operation": change.operation,
            "changed": list(change.changed),
            "old_schema": change.old_schema,
            "new_schema": change.new_schema,
        }
        log.warning(
            "restarting a streaming query after a source metadata change: %s",
            json.dumps(fields),
            extra=fields,
        )


def _wait(query: StreamingQueryLike, deadline: float | None) -> BaseException | None:
    """The query's error once it terminates; None when it ended cleanly or time ran out."""
    try:
        if deadline is None:
            query.awaitTermination()
        else:
            while not query.awaitTermination(max(0.1, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    return None
    except Exception as exc:
        return exc
    return query.exception()


def _stop_quietly(query: StreamingQueryLike) -> None:
    try:
        query.stop()
    except Exception as exc:  # a terminated query; nothing to release
        log.debug("stopping a failed query raised %s", exc)
