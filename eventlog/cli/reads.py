"""Subcommands that read: ``history``, ``show``, ``describe`` and ``diff``."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

import pyarrow as pa
import pyarrow.compute as pc
import typer
from rich.console import RenderableType
from rich.text import Text

from eventlog.cli.options import Settings
from eventlog.cli.output import arrow_table, emit, fields, iso, pairs, rows_json, table
from eventlog.files.pruning import file_stats
from eventlog.log.checkpoint import find_latest_checkpoint
from eventlog.log.storage import LogStore
from eventlog.table import Table

TableArg = Annotated[str, typer.Argument(metavar="TABLE", help="Table URI or path.", show_default=False)]

HISTORY_KEYS = (
    "version",
    "timestamp",
    "userId",
    "userName",
    "operation",
    "operationParameters",
    "readVersion",
    "isolationLevel",
    "isBlindAppend",
    "operationMetrics",
    "userMetadata",
    "engineInfo",
    "txnId",
)
_MAPPINGS = ("operationParameters", "operationMetrics")
_ALWAYS_SHOWN = ("version", "timestamp", "operation")
DIFF_ROWS_SHOWN = 50  # rows of each side the --rows table shows (--json has all)


# --------------------------------------------------------------------------- history


def history(
    settings: Settings,
    uri: TableArg,
    limit: Annotated[int, typer.Option(min=0, help="Newest versions to show; 0 for all.")] = 20,
) -> None:
    """DESCRIBE HISTORY: the commitInfo of each version, newest first."""
    with settings.open(uri) as t:
        entries = t.history(limit or None)
        data = {"table": t.uri, "history": [history_entry(e) for e in entries]}
    emit(settings, data, _render_history)


def history_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """The DESCRIBE HISTORY columns of one ``Table.history()`` entry (null when absent)."""
    return {k: entry.get(k, {} if k in _MAPPINGS else None) for k in HISTORY_KEYS}


def _render_history(data: dict[str, Any]) -> list[RenderableType]:
    entries = data["history"]
    columns = [k for k in HISTORY_KEYS if k in _ALWAYS_SHOWN or any(e[k] not in (None, {}) for e in entries)]
    rows = []
    for e in entries:
        cells: dict[str, Any] = dict(e)
        cells["timestamp"] = iso(e["timestamp"])
        for key in _MAPPINGS:
            cells[key] = pairs(e[key])
        rows.append([cells[c] for c in columns])
    return table(f"History of {data['table']}", columns, rows)


# --------------------------------------------------------------------------- show


def show(
    settings: Settings,
    uri: TableArg,
    as_of: Annotated[
        str | None,
        typer.Option(
            "--as-of",
            metavar="N|TIMESTAMP",
            help="Time travel: a version number, or an ISO 8601 timestamp (UTC unless it says).",
            show_default=False,
        ),
    ] = None,
    where: Annotated[
        str | None, typer.Option(metavar="SQL", help="A SQL predicate on the rows.", show_default=False)
    ] = None,
    limit: Annotated[int, typer.Option(min=0, help="Rows to show; 0 for all.")] = 20,
    columns: Annotated[
        str | None, typer.Option(metavar="A,B", help="Columns to show (comma-separated).", show_default=False)
    ] = None,
    row_ids: Annotated[
        bool,
        typer.Option(
            "--row-ids", help="Add each row's stable _row_id and _row_commit_version (row tracking tables)."
        ),
    ] = False,
) -> None:
    """The table's rows (at the latest version, or as of a version or time)."""
    names = column_list(columns, "--columns")
    with settings.open(uri) as t:
        version = _resolve_version(t, as_of)
        rows = t.to_arrow(where, names, version, row_ids=row_ids)
        matched = rows.num_rows
        if limit:
            rows = rows.slice(0, limit)
        data = {
            "table": t.uri,
            "version": version,
            "columns": rows.column_names,
            "rows": rows_json(rows),
            "num_rows": rows.num_rows,
            "matched_rows": matched,
            "truncated": rows.num_rows < matched,
        }
    emit(settings, data, _render_show)


def _resolve_version(t: Table, as_of: str | None) -> int:
    if as_of is None:
        return t.version
    if re.fullmatch(r"[0-9]+", as_of):
        return int(as_of)
    return t.version_at(as_of)


def column_list(value: str | None, option: str) -> list[str] | None:
    if value is None:
        return None
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise typer.BadParameter(f"no column names in {value!r}", param_hint=f"'{option}'")
    return names


def _render_show(data: dict[str, Any]) -> list[RenderableType]:
    caption = f"{data['num_rows']} of {data['matched_rows']} rows" if data["truncated"] else None
    title = f"{data['table']} at version {data['version']}"
    return arrow_table(title, data["rows"], data["columns"], caption=caption)


# --------------------------------------------------------------------------- describe


def describe(settings: Settings, uri: TableArg) -> None:
    """Schema, partitioning, properties, protocol, files, size and latest checkpoint."""
    with settings.open(uri) as t:
        snap = t.snapshot()
        names = t.log.list_log()
        bounds = LogStore.commit_version_bounds(names)
        files = snap.live_files
        num_files, size_bytes, num_rows = file_totals(files)
        meta = snap.metadata
        protocol = snap.protocol
        data = {
            "table": t.uri,
            "id": meta.id,
            "name": meta.name,
            "description": meta.description,
            "version": snap.version,
            "earliest_version": bounds[0] if bounds else None,
            "created_time": meta.created_time,
            "schema": json.loads(meta.schema_string),
            "partition_columns": list(meta.partition_columns),
            "properties": dict(meta.configuration),
            "protocol": {
                "minReaderVersion": protocol.min_reader_version,
                "minWriterVersion": protocol.min_writer_version,
                "readerFeatures": _listed(protocol.reader_features),
                "writerFeatures": _listed(protocol.writer_features),
            },
            "num_files": num_files,
            "size_bytes": size_bytes,
            "num_rows": num_rows,
            "latest_checkpoint": find_latest_checkpoint(t.log.fs, t.log.log_dir, listing=names),
        }
    emit(settings, data, _render_describe)


def file_totals(files: pa.Table) -> tuple[int, int, int | None]:
    """(files, bytes, rows) of add rows ``files``, from their columns: rows are the
    statistics' ``numRecords`` less the rows deletion vectors drop, or None when a file
    has no row count."""
    records = file_stats(files, pa.schema([])).column("numRecords")
    num_rows = None
    if records.null_count == 0:
        dv_rows = pc.sum(pc.struct_field(files.column("deletionVector"), "cardinality")).as_py() or 0
        num_rows = (pc.sum(records).as_py() or 0) - dv_rows
    return files.num_rows, pc.sum(files.column("size")).as_py() or 0, num_rows


def _listed(values: tuple[str, ...] | None) -> list[str] | None:
    return None if values is None else list(values)


def type_name(t: Any) -> str:
    """A Delta schema type (JSON) in one line: ``long``, ``array<string>``, ``struct<a: long>``."""
    if isinstance(t, str):
        return t
    kind = t.get("type") if isinstance(t, dict) else None
    if kind == "struct":
        return "struct<" + ", ".join(f"{f['name']}: {type_name(f['type'])}" for f in t["fields"]) + ">"
    if kind == "array":
        return f"array<{type_name(t['elementType'])}>"
    if kind == "map":
        return f"map<{type_name(t['keyType'])}, {type_name(t['valueType'])}>"
    return json.dumps(t)


def _render_describe(data: dict[str, Any]) -> list[RenderableType]:
    protocol = data["protocol"]
    overview = {
        "table": data["table"],
        "id": data["id"],
        "name": data["name"],
        "description": data["description"],
        "version": data["version"],
        "earliest version": data["earliest_version"],
        "created": iso(data["created_time"]),
        "partition columns": ", ".join(data["partition_columns"]) or Text("none", style="dim"),
        "protocol": f"reader {protocol['minReaderVersion']}, writer {protocol['minWriterVersion']}",
        "reader features": protocol["readerFeatures"],
        "writer features": protocol["writerFeatures"],
        "files": data["num_files"],
        "size (bytes)": data["size_bytes"],
        "rows": data["num_rows"],
        "latest checkpoint": data["latest_checkpoint"],
    }
    partitions = set(data["partition_columns"])
    schema_rows = [
        [f["name"], type_name(f["type"]), f.get("nullable", True), f["name"] in partitions]
        for f in data["schema"].get("fields", [])
    ]
    return [
        *fields(f"Table {data['table']}", overview),
        *table("Schema", ["column", "type", "nullable", "partition"], schema_rows),
        *table("Properties", ["key", "value"], sorted(data["properties"].items())),
    ]


# --------------------------------------------------------------------------- diff


def diff(
    settings: Settings,
    uri: TableArg,
    from_version: Annotated[int, typer.Argument(metavar="A", min=0, help="The earlier version.")],
    to_version: Annotated[
        int | None,
        typer.Argument(metavar="B", min=0, help="The later version [default: latest].", show_default=False),
    ] = None,
    rows: Annotated[bool, typer.Option("--rows", help="Read the data: the rows added and removed.")] = False,
) -> None:
    """Files (and with --rows the rows) added and removed between versions A and B."""
    with settings.open(uri) as t:
        d = t.diff(from_version, to_version, rows=rows)
        data = {
            "table": t.uri,
            "from_version": d.from_version,
            "to_version": d.to_version,
            "files_added": list(d.files_added),
            "files_removed": list(d.files_removed),
            "dv_changed": [
                {"path": path, "deleted_before": before, "deleted_after": after}
                for path, (before, after) in sorted(d.dv_changed.items())
            ],
            "rows_added": d.rows_added,
            "rows_removed": d.rows_removed,
            "added": rows_json(d.added) if d.added is not None else None,
            "removed": rows_json(d.removed) if d.removed is not None else None,
            "columns": d.added.column_names if d.added is not None else None,
        }
    emit(settings, data, _render_diff)


def _render_diff(data: dict[str, Any]) -> list[RenderableType]:
    summary = {
        "from version": data["from_version"],
        "to version": data["to_version"],
        "files added": len(data["files_added"]),
        "files removed": len(data["files_removed"]),
        "deletion vectors changed": len(data["dv_changed"]),
        "rows added": data["rows_added"],
        "rows removed": data["rows_removed"],
    }
    files = [["+", p] for p in data["files_added"]] + [["-", p] for p in data["files_removed"]]
    files += [
        ["dv", f"{c['path']} (deleted rows {c['deleted_before']} -> {c['deleted_after']})"]
        for c in data["dv_changed"]
    ]
    out = [*fields(f"Diff of {data['table']}", summary), *table("Files", ["", "path"], files)]
    for key, title in (("added", "Rows added"), ("removed", "Rows removed")):
        side = data[key]
        if side is None:
            continue
        caption = None
        if len(side) > DIFF_ROWS_SHOWN:
            caption = f"{DIFF_ROWS_SHOWN} of {len(side)} rows (--json has all)"
        out += arrow_table(title, side[:DIFF_ROWS_SHOWN], data["columns"], caption=caption)
    return out
