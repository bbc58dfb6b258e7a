"""Output of the ``eventlog`` program: JSON for scripts, rich tables for people, progress.

Every command builds one JSON-ready value and either prints it (``--json``) or renders it
with rich. User data (paths, values, messages) goes into tables as :class:`rich.text.Text`,
so square brackets in it are never read as rich markup.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import decimal
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table as RichTable
from rich.text import Text

from eventlog.cli.options import Settings

PIPE_WIDTH = 200


def console() -> Console:
    """A console on the current ``sys.stdout`` (tests swap it). Off a terminal, tables may be
    as wide as they need (up to ``$COLUMNS``, or :data:`PIPE_WIDTH`): a file keeps every
    character instead of wrapping to rich's default 80 columns."""
    if stdout_is_terminal() or os.environ.get("COLUMNS"):
        return Console(file=sys.stdout)
    return Console(file=sys.stdout, width=PIPE_WIDTH)


def stdout_is_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def jsonable(value: Any) -> Any:
    """``value`` with every part JSON can hold: datetimes (ISO 8601), decimals (strings),
    bytes (base64) and non-finite floats (``"NaN"``, ``"Infinity"``, ``"-Infinity"``)."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    return value


def rows_json(table: pa.Table) -> list[dict[str, Any]]:
    return [jsonable(row) for row in table.to_pylist()]


def emit(settings: Settings, data: Any, render: Callable[[Any], Sequence[RenderableType]]) -> None:
    """Print ``data`` as JSON (``--json``) or what ``render(data)`` makes of it."""
    if settings.json:
        sys.stdout.write(json.dumps(jsonable(data), indent=2) + "\n")
        sys.stdout.flush()
        return
    out = console()
    for item in render(data):
        out.print(item)


class Bar:
    """The progress of one piece of work (does nothing when no bar is shown)."""

    def __init__(self, progress: Progress | None = None, task: TaskID | None = None) -> None:
        self._progress = progress
        self._task = task

    def advance(self, n: int = 1) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, n)

    def __call__(self, done: int, total: int) -> None:
        """``done`` of ``total`` steps (the engine's progress callbacks)."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=done, total=total)


@contextlib.contextmanager
def progress(description: str, total: int | None = None) -> Iterator[Bar]:
    """A progress bar while the block runs. Shown only when stdout is a terminal (never in
    pipes, files or tests), and cleared when the block ends."""
    if not stdout_is_terminal():
        yield Bar()
        return
    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    with Progress(*columns, TimeElapsedColumn(), console=console(), transient=True) as bar:
        yield Bar(bar, bar.add_task(description, total=total))


# --------------------------------------------------------------------------- cells


def text(value: Any) -> Text:
    """A table cell: ``value`` as plain text (no markup); None is a dim ``null``."""
    if value is None:
        return Text("null", style="dim")
    if isinstance(value, bool):
        return Text("true" if value else "false")
    if isinstance(value, (Mapping, list, tuple)):
        return Text(json.dumps(jsonable(value), separators=(",", ":"), ensure_ascii=False, default=str))
    return Text(str(value))


def pairs(mapping: Mapping[str, Any] | None) -> Text:
    """``k=v`` lines (operation parameters and metrics)."""
    if not mapping:
        return Text("")
    return Text("\n".join(f"{k}={v}" for k, v in mapping.items()))


def iso(ms: int | None) -> str | None:
    """A commit time (ms since the epoch) as UTC ISO 8601, e.g. ``2024-05-01T12:00:00.000Z``."""
    if ms is None:
        return None
    stamp = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def heading(title: str) -> Text:
    return Text(title, style="bold")


def table(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *, caption: str | None = None
) -> list[RenderableType]:
    """A heading and a table of ``rows`` (cells through :func:`text` unless already Text),
    or the heading and "none" when there are no rows. Long values fold, never truncate."""
    if not rows:
        return [Text.assemble(heading(title), (": none", "dim"))]
    out = RichTable(caption=Text(caption) if caption else None)
    for name in columns:
        out.add_column(Text(name), overflow="fold")
    for row in rows:
        out.add_row(*(cell if isinstance(cell, Text) else text(cell) for cell in row))
    return [heading(title), out]


def fields(title: str, mapping: Mapping[str, Any]) -> list[RenderableType]:
    """A heading and a two-column table of names and values."""
    out = RichTable(show_header=False)
    out.add_column(style="bold", no_wrap=True)
    out.add_column(overflow="fold")
    for key, value in mapping.items():
        out.add_row(Text(key), value if isinstance(value, Text) else text(value))
    return [heading(title), out]


def arrow_table(
    title: str, rows: list[dict[str, Any]], columns: Sequence[str], *, caption: str | None = None
) -> list[RenderableType]:
    """Rows (as :func:`rows_json` makes them) under their column names."""
    return table(title, columns, [[row.get(c) for c in columns] for row in rows], caption=caption)
