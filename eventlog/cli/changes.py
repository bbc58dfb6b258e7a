"""The ``changes`` subcommand: the change data feed (``Table.changes``), what each version did
to which rows, for auditors."""

from __future__ import annotations

import dataclasses
import enum
import io
import sys
from typing import Annotated, Any

import pyarrow as pa
import pyarrow.csv as pacsv
import typer
from rich.console import RenderableType

from eventlog.cli.options import Settings
from eventlog.cli.output import arrow_table, emit, rows_json
from eventlog.cli.reads import TableArg, column_list


class Format(enum.StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def _version_option(flag: str, what: str) -> Any:
    return typer.Option(flag, metavar="N", min=0, help=what, show_default=False)


def _time_option(flag: str, what: str) -> Any:
    return typer.Option(
        flag, metavar="TIMESTAMP", help=what + " (ISO 8601, UTC unless it says).", show_default=False
    )


def changes(
    settings: Settings,
    uri: TableArg,
    start_version: Annotated[int | None, _version_option("--start-version", "First version.")] = None,
    end_version: Annotated[
        int | None, _version_option("--end-version", "Last version [default: latest].")
    ] = None,
    start_timestamp: Annotated[
        str | None, _time_option("--start-timestamp", "From the first version committed at or after")
    ] = None,
    end_timestamp: Annotated[
        str | None, _time_option("--end-timestamp", "To the last version committed at or before")
    ] = None,
    where: Annotated[
        str | None,
        typer.Option(
            metavar="SQL",
            help="A SQL predicate on the rows and _change_type, _commit_version...",
            show_default=False,
        ),
    ] = None,
    columns: Annotated[
        str | None, typer.Option(metavar="A,B", help="Columns to show (comma-separated).", show_default=False)
    ] = None,
    limit: Annotated[int, typer.Option(min=0, help="Rows to show; 0 for all.")] = 0,
    format: Annotated[
        Format | None, typer.Option("--format", help="Output format [default: table, json with --json].")
    ] = None,
) -> None:
    """The change data feed: the rows each version inserted, deleted or updated."""
    names = column_list(columns, "--columns")
    if start_version is None and start_timestamp is None:
        raise typer.BadParameter("give --start-version or --start-timestamp", param_hint="'--start-version'")
    with settings.open(uri) as t:
        rows = t.changes(
            start_version, end_version, start_timestamp=start_timestamp, end_timestamp=end_timestamp,
            columns=names, filter=where,
        )  # fmt: skip
        matched = rows.num_rows
        if limit:
            rows = rows.slice(0, limit)
        data = {
            "table": t.uri,
            "columns": rows.column_names,
            "rows": rows_json(rows),
            "num_rows": rows.num_rows,
            "matched_rows": matched,
            "truncated": rows.num_rows < matched,
        }
    chosen = format or (Format.json if settings.json else Format.table)
    if chosen is Format.csv:
        _write_csv(rows)
    else:
        emit(dataclasses.replace(settings, json=chosen is Format.json), data, _render)


def _write_csv(rows: pa.Table) -> None:
    """The rows as CSV with a header; timestamps in ISO 8601."""
    buffer = io.BytesIO()
    pacsv.write_csv(rows, buffer)
    sys.stdout.write(buffer.getvalue().decode("utf-8"))
    sys.stdout.flush()


def _render(data: dict[str, Any]) -> list[RenderableType]:
    caption = f"{data['num_rows']} of {data['matched_rows']} rows" if data["truncated"] else None
    return arrow_table(f"Changes of {data['table']}", data["rows"], data["columns"], caption=caption)
