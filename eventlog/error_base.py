"""The root of :mod:`eventlog`'s errors and of its "bad input" family (re-exported from
:mod:`eventlog.errors`, where users import them): every class stores its constructor's
keyword arguments as fields and rebuilds itself from them when unpickled."""

from __future__ import annotations

from typing import Any

__all__ = ["EventlogError", "InvalidInputError"]


class EventlogError(Exception):
    """Root of every error raised by :mod:`eventlog`.

    Structured fields are set from the constructor's keyword arguments; the ones the
    subclasses use are declared here so type checkers know them.
    """

    uri: str
    version: int | None
    line: int | None
    requested: Any
    earliest: int
    latest: int
    features: list[str]
    columns: list[str]
    column: str
    available: list[str]
    context: str
    expression: str
    key: str
    value: str
    allowed: list[str]
    rows: int
    attempts: int
    start_version: int
    last_attempted_version: int
    elapsed_ms: float
    txn_id: str
    winning_version: int
    operation: str
    winning_commit_info: dict[str, Any]
    partition: str | None
    isolation_level: str | None
    table: str
    detail: str
    conflict_type: str
    argument: str
    reason: str
    position: int | None
    differences: list[str]
    anchored_digest: str | None
    constraint: str
    sample: list[dict[str, Any]]
    values: dict[str, Any]
    count: int
    start: int
    end: int | None

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self._fields = dict(fields)
        for key, value in fields.items():
            setattr(self, key, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self._fields, self.__cause__))

    def __str__(self) -> str:
        return self.message


def _rebuild(
    cls: type[EventlogError], message: str, fields: dict[str, Any], cause: BaseException | None
) -> EventlogError:
    err = cls.__new__(cls)
    EventlogError.__init__(err, message, **fields)
    err.__cause__ = cause
    return err


class InvalidInputError(EventlogError):
    """Bad user input, rejected before anything was written."""
