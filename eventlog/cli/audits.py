"""Subcommands for auditors: ``replay`` (how the table got here) and ``verify`` (tamper
evidence)."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer
from rich.console import RenderableType
from rich.text import Text

from eventlog.cli.options import AcceptLostOption, Settings
from eventlog.cli.output import emit, fields, iso, progress, table, text
from eventlog.cli.reads import TableArg
from eventlog.log.verify import VerifyReport
from eventlog.snapshot.replay import VersionChange

AUDIT_KEY_ENV = "EVENTLOG_AUDIT_KEY"  # as eventlog.log.audit reads it

REPLAY_KEYS = (
    "version",
    "timestamp",
    "operation",
    "parameters",
    "read_version",
    "isolation_level",
    "engine",
    "user_metadata",
    "txn_ids",
    "streaming",
    "files_added",
    "files_removed",
    "rows_added",
    "rows_removed",
    "rows_deleted_by_dv",
    "data_change",
    "metadata_changed",
    "protocol_changed",
)
VERIFY_KEYS = (
    "ok",
    "first_bad_version",
    "problem",
    "detail",
    "checked_from",
    "chained_from",
    "versions_checked",
    "anchors_checked",
    "hmac_checked",
    "unanchored",
    "unguarded",
    "notes",
)


# --------------------------------------------------------------------------- replay


def replay(
    settings: Settings,
    uri: TableArg,
    to: Annotated[
        int | None,
        typer.Option(
            "--to", metavar="N", min=0, help="Last version to replay [default: latest].", show_default=False
        ),
    ] = None,
) -> None:
    """Rebuild the table from its events, version by version, checking every step."""
    with settings.open(uri) as t:
        run = t.replay(to)
        changes = []
        with progress("Replaying", run.to_version - run.start_version + 1) as bar:
            for change in run:
                changes.append(change_json(change))
                bar.advance()
        data = {
            "table": t.uri,
            "start_version": run.start_version,
            "from_checkpoint": run.from_checkpoint,
            "to_version": run.to_version,
            "versions": changes,
        }
    emit(settings, data, _render_replay)


def change_json(change: VersionChange) -> dict[str, Any]:
    out = {key: getattr(change, key) for key in REPLAY_KEYS}
    out["parameters"] = dict(change.parameters)
    out["txn_ids"] = list(change.txn_ids)
    out["streaming"] = dict(change.streaming) if change.streaming is not None else None
    out["files_added"] = list(change.files_added)
    out["files_removed"] = list(change.files_removed)
    return out


def _plus_minus(added: int | None, removed: int | None) -> Text:
    def n(value: int | None) -> str:
        return "?" if value is None else str(value)

    return Text(f"+{n(added)} -{n(removed)}")


def started_from(data: dict[str, Any]) -> str:
    """Where a replay started, in words."""
    if data["from_checkpoint"] is None:
        return "version 0"
    return f"checkpoint {data['from_checkpoint']}"


def _render_replay(data: dict[str, Any]) -> list[RenderableType]:
    rows = []
    for c in data["versions"]:
        who = c["engine"] or ""
        if c["user_metadata"]:
            who += f" ({c['user_metadata']})"
        rows.append(
            [
                c["version"],
                c["operation"],
                _plus_minus(len(c["files_added"]), len(c["files_removed"])),
                _plus_minus(c["rows_added"], c["rows_removed"]),
                iso(c["timestamp"]),
                who,
                ", ".join(c["txn_ids"]),
            ]
        )
    title = f"Replay of {data['table']} from {started_from(data)} to version {data['to_version']}"
    caption = "the events rebuild the table's snapshot at every version checked"
    columns = ["version", "operation", "files", "rows", "when", "who", "txn"]
    return table(title, columns, rows, caption=caption)


# --------------------------------------------------------------------------- verify


def verify(
    settings: Settings,
    uri: TableArg,
    key_env: Annotated[
        str | None,
        typer.Option(
            "--key-env",
            metavar="VAR",
            help=f"Environment variable holding the audit (HMAC) key [default: {AUDIT_KEY_ENV}, if set].",
            show_default=False,
        ),
    ] = None,
    accept_lost: AcceptLostOption = None,
    require_anchors: Annotated[
        bool,
        typer.Option("--require-anchors", help="Fail when chained commits have no anchor in the slot store."),
    ] = False,
    allow_unguarded: Annotated[
        bool,
        typer.Option(
            "--allow-unguarded",
            help="Accept commits other Delta writers (Delta Spark, delta-rs) made outside the "
            "version slots: noted instead of failing.",
        ),
    ] = False,
) -> int:
    """Check the commits' hash chain, the slot anchors and (with a key) the HMACs.

    Exits 1, naming the first bad version, when the log was tampered with or an
    acknowledged commit was lost. Warns (on stderr) when commits have no slot anchor.
    """
    key = audit_key(key_env)
    # A handle reads nothing yet: a removed commit must reach verify, not fail opening.
    with settings.handle(uri) as t:
        with progress("Verifying") as bar:
            report = t.verify(
                key=key,
                progress=bar,
                accept_lost=accept_lost or (),
                require_anchors=require_anchors,
                allow_unguarded=allow_unguarded,
            )
        data = verify_json(t.uri, report)
    emit(settings, data, _render_verify)
    if report.unanchored and report.problem != "unanchored":
        sys.stderr.write(
            f"eventlog: warning: {report.unanchored} chained commit(s) have no anchor in the slot store; "
            "edits that recompute the hash chain cannot be detected (see the notes; --require-anchors "
            "makes this a failure)\n"
        )
    if not data["ok"]:
        sys.stderr.write(f"eventlog: verify failed: {failure(data)}\n")
        return 1
    return 0


def audit_key(key_env: str | None) -> bytes | None:
    """The audit key (UTF-8) from ``key_env``, or ``$EVENTLOG_AUDIT_KEY`` when it is None.

    A variable named explicitly must be set: a check silently run without its key would
    pass for the wrong reason.
    """
    value = os.environ.get(key_env or AUDIT_KEY_ENV)
    if key_env is not None and not value:
        raise typer.BadParameter(f"environment variable {key_env} is not set", param_hint="'--key-env'")
    return value.encode() if value else None


def verify_json(uri: str, report: VerifyReport) -> dict[str, Any]:
    out: dict[str, Any] = {"table": uri}
    out.update({key: getattr(report, key) for key in VERIFY_KEYS})
    out["notes"] = list(report.notes)
    out["unguarded"] = [[version, engine] for version, engine in report.unguarded]
    return out


def failure(data: dict[str, Any]) -> str:
    """The verdict of a failed verify in one line."""
    version = data["first_bad_version"]
    where = f"version {version}" if version is not None else "the log"
    detail = f" ({data['detail']})" if data["detail"] else ""
    return f"{where} {data['problem'] or 'failed'}{detail}"


def _render_verify(data: dict[str, Any]) -> list[RenderableType]:
    if data["ok"]:
        verdict = Text("OK", style="bold green")
    else:
        verdict = Text("FAILED", style="bold red")
    summary = {
        "result": verdict,
        "first bad version": data["first_bad_version"],
        "problem": data["problem"],
        "detail": data["detail"],
        "checked from version": data["checked_from"],
        "chained from version": data["chained_from"],
        "versions checked": data["versions_checked"],
        "anchors checked": data["anchors_checked"],
        "HMAC checked": data["hmac_checked"],
    }
    out = fields(f"Verify {data['table']}", summary)
    for note in data["notes"]:
        out.append(text(f"note: {note}"))
    return out
