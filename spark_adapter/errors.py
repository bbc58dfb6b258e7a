"""Typed errors out of Spark tasks.

Spark does not hand a Python exception raised in a task back to the driver: the job fails
with a ``Py4JJavaError``/``PythonException`` holding the worker's traceback as *text*. A
task therefore raises its :class:`~eventlog.errors.EventlogError` (a
``ConstraintViolationError`` of a write, say) inside :func:`typed_task_errors`, which adds
one line, ``EVENTLOG_ERROR {"class": ..., "message": ..., "fields": {...}}``, to the error
text; :func:`recover_error` rebuilds the typed error from it on the driver.

The Spark DML of :class:`~spark_adapter.table.EventlogTable` raises the rebuilt error itself
(chained to Spark's); a ``df.write.format("eventlog").save(...)`` or a streaming query raises
Spark's, from which ``recover_error(exc)`` gives the typed one. Field values travel as JSON:
numbers, strings and booleans keep their type; dates, timestamps and decimals arrive as
their text.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from eventlog import errors as el_errors
from eventlog.errors import EventlogError

__all__ = ["MARKER", "TaskError", "UnsupportedStatementError", "recover_error", "typed_task_errors"]

MARKER = "EVENTLOG_ERROR "


class TaskError(RuntimeError):
    """What a task raises in place of an EventlogError: its text plus the payload line."""


def _payload(exc: EventlogError) -> str:
    fields = dict(getattr(exc, "_fields", {}))
    body = {"class": type(exc).__name__, "message": exc.message, "fields": fields}
    return MARKER + json.dumps(body, sort_keys=True, default=str)


@contextlib.contextmanager
def typed_task_errors() -> Iterator[None]:
    """Run task code: an EventlogError leaves as a :class:`TaskError` carrying it."""
    try:
        yield
    except EventlogError as exc:
        raise TaskError(f"{type(exc).__name__}: {exc}\n{_payload(exc)}") from exc


def recover_error(error: BaseException | str | None) -> EventlogError | None:
    """The eventlog error behind ``error`` (a Spark job failure, its text, or the error
    itself / one in its cause chain); None when there is none."""
    node: BaseException | None = error if isinstance(error, BaseException) else None
    seen: set[int] = set()
    while node is not None and id(node) not in seen:
        if isinstance(node, EventlogError):
            return node
        seen.add(id(node))
        node = node.__cause__ or node.__context__
    text = error if isinstance(error, str) else str(error) if error is not None else ""
    start = text.rfind(MARKER)
    if start < 0:
        return None
    line = text[start + len(MARKER) :].split("\n", 1)[0].strip()
    try:
        body: Any = json.loads(line)
        cls = getattr(el_errors, str(body["class"]), None)
        message, fields = str(body["message"]), dict(body["fields"])
    except (ValueError, KeyError, TypeError):
        return None
    if not (isinstance(cls, type) and issubclass(cls, EventlogError)):
        return None
    err = cls.__new__(cls)
    EventlogError.__init__(err, message, **fields)
    return err


class UnsupportedStatementError(el_errors.InvalidInputError):
    """A SQL statement on an eventlog table that :func:`spark_adapter.sql.sql` cannot run:
    it does not parse, or uses a clause not supported here. Nothing was written. Fields:
    ``statement`` (its text, up to 500 characters) and ``reason`` (what is unsupported, and
    where)."""

    statement: str
    reason: str

    def __init__(self, statement: str, reason: str) -> None:
        text = " ".join(statement.split())[:500]
        EventlogError.__init__(
            self, f"cannot run SQL statement {text[:200]!r}: {reason}", statement=text, reason=reason
        )
