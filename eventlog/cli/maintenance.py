"""Subcommands that change the table or its slots: ``vacuum``, ``optimize``, ``reorg``,
``restore``, ``drop-feature``, ``slots status`` and ``slots repair``.

Every one that commits takes ``--durable`` (durable mode, :mod:`eventlog.log.durable`): the
files and directory entries it writes are fsynced before its commit is acknowledged.
``vacuum`` commits nothing (it deletes files no version reads; a deletion a power loss
undoes leaves an unreferenced file that the next VACUUM deletes again), so it has none."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import RenderableType

from eventlog.cli.options import AcceptLostOption, DurableOption, Settings
from eventlog.cli.output import emit, fields, pairs, progress, table
from eventlog.cli.reads import TableArg, column_list
from eventlog.errors import InvalidInputError
from eventlog.txn.transaction import CommitResult
from lockstore.cli import slot_report

SlotLimit = Annotated[int, typer.Option(min=1, help="How many of the newest slots to inspect.")]
PartitionWhere = Annotated[
    str | None,
    typer.Option(metavar="SQL", help="Only partitions matching this predicate.", show_default=False),
]


# --------------------------------------------------------------------------- vacuum


def vacuum(
    settings: Settings,
    uri: TableArg,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the files; delete nothing.")] = False,
    retention_hours: Annotated[
        float | None,
        typer.Option(
            metavar="H",
            min=0,
            help="Keep files retired less than H hours ago [default: the table's "
            "delta.deletedFileRetentionDuration, one week]; shorter than the table's is refused.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Delete data files no version within the retention period can read."""
    with settings.open(uri) as t:
        with progress("Vacuuming"):
            files = t.vacuum(retention_hours, dry_run=dry_run)
        data = {
            "table": t.uri,
            "dry_run": dry_run,
            "retention_hours": retention_hours,
            "files": sorted(files),
            "num_files": len(files),
        }
    emit(settings, data, _render_vacuum)


def _render_vacuum(data: dict[str, Any]) -> list[RenderableType]:
    verb = "would delete" if data["dry_run"] else "deleted"
    title = f"Vacuum of {data['table']} {verb} {data['num_files']} files"
    return table(title, ["path"], [[p] for p in data["files"]])


# --------------------------------------------------------------------------- optimize, restore


def optimize(
    settings: Settings,
    uri: TableArg,
    where: PartitionWhere = None,
    zorder_by: Annotated[
        str | None,
        typer.Option(metavar="COLS", help="Z-order by these columns (comma-separated).", show_default=False),
    ] = None,
    durable: DurableOption = False,
) -> None:
    """Compact small files (bin-packing), optionally Z-ordered; a dataChange=false commit."""
    columns = column_list(zorder_by, "--zorder-by")
    with settings.open(uri, durable=durable) as t:
        with progress("Optimizing"):
            result = t.optimize(columns, partition_filter=where)
        data = commit_json(t.uri, result)
        data.update({"where": where, "zorder_by": columns or []})
    emit(settings, data, _render_commit)


def reorg(
    settings: Settings,
    uri: TableArg,
    purge: Annotated[
        bool,
        typer.Option("--purge", help="APPLY (PURGE): rewrite the files with deletion vectors (required)."),
    ] = False,
    where: PartitionWhere = None,
    durable: DurableOption = False,
) -> None:
    """REORG TABLE ... APPLY (PURGE): physically remove deleted rows; a dataChange=false commit."""
    if not purge:
        raise InvalidInputError(
            "reorg needs --purge (REORG TABLE ... APPLY (PURGE) is the one REORG it runs)"
        )
    with settings.open(uri, durable=durable) as t:
        with progress("Purging"):
            result = t.reorg_purge(where)
        data = commit_json(t.uri, result)
        data.update({"where": where, "purge": True})
    emit(settings, data, _render_commit)


def restore(
    settings: Settings,
    uri: TableArg,
    version: Annotated[int, typer.Argument(metavar="N", min=0, help="The version to restore.")],
    durable: DurableOption = False,
) -> None:
    """Make version N's files live again, as a new version (RESTORE)."""
    with settings.open(uri, durable=durable) as t:
        result = t.restore(version)
        data = commit_json(t.uri, result)
        data["restored_version"] = version
    emit(settings, data, _render_commit)


def drop_feature(
    settings: Settings,
    uri: TableArg,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The table feature, e.g. deletionVectors.")],
    truncate_history: Annotated[
        bool,
        typer.Option("--truncate-history", help="TRUNCATE HISTORY: the kept log must no longer use it."),
    ] = False,
    durable: DurableOption = False,
) -> None:
    """ALTER TABLE ... DROP FEATURE: remove the feature's traces, then downgrade the protocol."""
    with settings.open(uri, durable=durable) as t:
        with progress("Dropping"):
            result = t.drop_feature(name, truncate_history=truncate_history)
        data = commit_json(t.uri, result)
        data.update({"feature": name, "truncate_history": truncate_history})
    emit(settings, data, _render_commit)


def commit_json(uri: str, result: CommitResult) -> dict[str, Any]:
    return {
        "table": uri,
        "version": result.version,
        "operation": result.operation,
        "metrics": dict(result.metrics),
        "txn_id": result.txn_id,
    }


def _render_commit(data: dict[str, Any]) -> list[RenderableType]:
    shown = {
        "version": data["version"],
        "operation": data["operation"],
        "metrics": pairs(data["metrics"]),
        "txn id": data["txn_id"],
    }
    if "restored_version" in data:
        shown["restored version"] = data["restored_version"]
    if "zorder_by" in data or "purge" in data:
        shown["where"] = data["where"]
    if "zorder_by" in data:
        shown["z-order by"] = ", ".join(data["zorder_by"])
    return fields(f"{data['operation']} of {data['table']}", shown)


# --------------------------------------------------------------------------- slots


def slots_status(settings: Settings, uri: TableArg, limit: SlotLimit = 100) -> None:
    """Latest claimed version, incomplete slots (owner, age, alive) and writer sessions."""
    # A handle: the slots must be seen before reading the log would finish them.
    with settings.handle(uri) as t:
        data = slot_report(t.slots, t.key, limit=limit)
    emit(settings, data, _render_status)


def _render_status(data: dict[str, Any]) -> list[RenderableType]:
    incomplete = [
        [s["version"], s["txn_id"], pairs(s["owner"]), s["staged"], s["age_seconds"], s["owner_alive"]]
        for s in data["incomplete"]
    ]
    sessions = [[name, pairs(owner)] for name, owner in sorted(data["sessions"].items())]
    return [
        *fields(f"Slots of {data['table']}", {"latest claimed version": data["latest"]}),
        *table("Incomplete slots", ["version", "txn id", "owner", "staged", "age (s)", "alive"], incomplete),
        *table("Writer sessions", ["session", "owner"], sessions),
    ]


def slots_repair(
    settings: Settings,
    uri: TableArg,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what it would do; change nothing.")] = False,
    limit: SlotLimit = 100,
    accept_lost: AcceptLostOption = None,
    durable: DurableOption = False,
) -> None:
    """Finish or resolve slots without their commit; what it does lands in the commit log.

    An acknowledged commit that is gone from the log is reported as lost and left alone,
    unless its version is given with --accept-lost.
    """
    with settings.handle(uri, durable=durable) as t:
        actions = t.repair_slots(dry_run=dry_run, limit=limit, accept_lost=accept_lost or ())
        data = {"table": t.key, "dry_run": dry_run, "actions": actions}
    emit(settings, data, _render_repair)


def _render_repair(data: dict[str, Any]) -> list[RenderableType]:
    title = f"Slot repair of {data['table']}" + (" (dry run)" if data["dry_run"] else "")
    rows = [[a["version"], a["txn_id"], a["action"]] for a in data["actions"]]
    return table(title, ["version", "txn id", "action"], rows)
