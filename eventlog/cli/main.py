"""The ``eventlog`` program (also ``python -m eventlog.cli``): tables from the shell.

    eventlog history TABLE [--limit N]
    eventlog show TABLE [--as-of N|TIMESTAMP] [--where SQL] [--limit N] [--columns A,B]
    eventlog describe TABLE
    eventlog diff TABLE A [B] [--rows]
    eventlog replay TABLE [--to N]
    eventlog changes TABLE --start-version N|--start-timestamp T [--end-version M] [--format F]
    eventlog verify TABLE [--key-env VAR] [--accept-lost N]... [--require-anchors] [--allow-unguarded]
    eventlog vacuum TABLE [--dry-run] [--retention-hours H]
    eventlog optimize TABLE [--where SQL] [--zorder-by COLS] [--durable]
    eventlog reorg TABLE --purge [--where SQL] [--durable]
    eventlog restore TABLE N [--durable]
    eventlog drop-feature TABLE NAME [--truncate-history] [--durable]
    eventlog slots status TABLE [--limit N]
    eventlog slots repair TABLE [--dry-run] [--limit N] [--accept-lost N]... [--durable]

Global options, before or after the subcommand: ``--slots SPEC`` (the slot store; default
``$EVENTLOG_SLOTS``, else the table's embedded store), ``--storage-option KEY=VALUE``
(repeatable; refused for now: tables take no filesystem options yet), ``--log-level
LEVEL`` (debug, info, warning, error, critical; to stderr), ``--json``, ``--debug``.

``--durable`` (the subcommands that commit): durable mode, every file and directory entry
the command writes fsynced before its commit is acknowledged (``Table.open(...,
durable=True)``; local tables).

Every subcommand prints tables for people, or with ``--json`` one JSON document for
scripts. Long work (replay, verify, vacuum, optimize, reorg) shows a progress bar when stdout is
a terminal, never otherwise.

Exit codes: 0 success; 1 a check failed (``verify`` found tampering; the log is damaged:
CorruptLogError, ReplayMismatchError) or the operation failed (a conflict, the slot store
unreachable); 2 bad input (no table at the URI, bad SQL, an unknown column, option or
version, a bad slot store spec). Errors print one line on stderr,
``eventlog: <ErrorType>: <message>`` (``eventlog: error: <message>`` for bad options), and a
traceback only with ``--debug``.

JSON output (keys are stable; new keys may be added). Times are milliseconds since the
Unix epoch (UTC); row values are JSON values, with timestamps and dates in ISO 8601,
decimals as strings, binary as base64 and non-finite floats as "NaN"/"Infinity".

* ``history``: ``{"table", "history": [entry]}``, newest first; each entry has DESCRIBE
  HISTORY's columns ``version, timestamp, userId, userName, operation,
  operationParameters, readVersion, isolationLevel, isBlindAppend, operationMetrics,
  userMetadata, engineInfo, txnId`` (null when the commit has none; the two maps ``{}``).
  ``--limit`` defaults to 20; 0 means all.
* ``show``: ``{"table", "version", "columns", "rows": [{column: value}], "num_rows",
  "matched_rows", "truncated"}``: ``matched_rows`` counts the rows matching ``--where``
  before ``--limit`` (default 20; 0 means all).
* ``describe``: ``{"table", "id", "name", "description", "version", "earliest_version",
  "created_time", "schema" (Delta's JSON schema), "partition_columns", "properties",
  "protocol": {"minReaderVersion", "minWriterVersion", "readerFeatures",
  "writerFeatures"}, "num_files", "size_bytes", "num_rows" (null when a file has no
  statistics), "latest_checkpoint" (null if none)}``.
* ``diff``: ``{"table", "from_version", "to_version", "files_added", "files_removed",
  "dv_changed": [{"path", "deleted_before", "deleted_after"}], "rows_added",
  "rows_removed", "added", "removed", "columns"}``; the last three are null without
  ``--rows``, else the rows only B has, the rows only A has, and their columns.
* ``replay``: ``{"table", "start_version", "from_checkpoint" (null when it started at
  version 0), "to_version", "versions": [change]}``; a change has ``version, timestamp,
  operation, parameters, read_version, isolation_level, engine, user_metadata, txn_ids,
  streaming, files_added, files_removed`` (paths), ``rows_added, rows_removed`` (null when
  a file has no statistics), ``rows_deleted_by_dv, data_change, metadata_changed,
  protocol_changed``.
* ``changes``: ``{"table", "columns", "rows", "num_rows", "matched_rows", "truncated"}``:
  the change data feed (``Table.changes``), each row with ``_change_type``,
  ``_commit_version`` and ``_commit_timestamp``; ``--where SQL``, ``--columns A,B``,
  ``--limit N`` (default 0: all); ``--format csv`` prints CSV with a header instead.
* ``verify``: ``{"table", "ok", "first_bad_version", "problem" (edited, removed,
  inserted, reordered, truncated, lost, unanchored, unguarded, non-monotonic; or null),
  "detail" (what was found, or null), "checked_from", "chained_from", "versions_checked", "anchors_checked",
  "hmac_checked", "unanchored", "unguarded" ([version, engine] pairs), "notes"}``; exit
  code 1 when ``ok`` is false, with
  ``eventlog: verify failed: version N <problem> (<detail>)`` on stderr, and a warning on
  stderr when chained commits have no slot anchor. ``--key-env VAR`` names the variable
  holding the HMAC key (default ``EVENTLOG_AUDIT_KEY``; a named variable must be set);
  ``--accept-lost N`` accepts a recorded loss; ``--require-anchors`` fails unanchored commits;
  ``--allow-unguarded`` accepts commits other Delta writers made outside the slots.
* ``vacuum``: ``{"table", "dry_run", "retention_hours", "files", "num_files"}``: the files
  deleted (or, with ``--dry-run``, that would be).
* ``optimize``: ``{"table", "version", "operation", "metrics", "txn_id", "where",
  "zorder_by"}``; ``reorg``: ``{"table", "version", "operation", "metrics", "txn_id",
  "where", "purge"}``; ``restore``: ``{"table", "version", "operation", "metrics", "txn_id",
  "restored_version"}``; ``drop-feature``: ``{"table", "version", "operation", "metrics",
  "txn_id", "feature", "truncate_history"}``.
* ``slots status``: ``{"table" (the slot key), "latest", "incomplete": [{"version",
  "txn_id", "owner", "staged", "age_seconds", "owner_alive"}], "sessions"}``.
* ``slots repair``: ``{"table" (the slot key), "dry_run", "actions": [{"version",
  "txn_id", "action"}]}``; see :meth:`eventlog.table.Table.repair_slots`. An action is
  ``mark-complete``, ``publish-staged``, ``repair-commit``, ``accept-lost``, ``skip: ...``
  or ``lost: ...`` (an acknowledged commit is gone: restore it or pass ``--accept-lost N``).
"""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Sequence

import typer

from eventlog.cli import audits, changes, maintenance, reads
from eventlog.cli.options import Settings, root_callback, with_global_options
from eventlog.errors import (
    EventlogError,
    InvalidInputError,
    TableAlreadyExistsError,
    TableNotFoundError,
    VersionNotFoundError,
)
from lockstore.base import LockstoreError
from lockstore.registry import UnknownSlotStoreError

PROG = "eventlog"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

# typer raises click's exceptions (since typer 0.26 from a copy of click inside typer, which
# exports only some of them): usage errors are the subclasses of the one typer.BadParameter has.
CLI_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")

BAD_INPUT = (
    InvalidInputError,  # bad SQL (PredicateError), unknown columns, bad text, bad timestamps...
    TableNotFoundError,
    TableAlreadyExistsError,
    VersionNotFoundError,
    UnknownSlotStoreError,
)

app = typer.Typer(
    name=PROG,
    add_completion=False,
    no_args_is_help=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    epilog="Exit codes: 0 success; 1 a check failed (verify, a damaged log) or the operation failed; "
    "2 bad input (no table there, bad SQL, an unknown option). Add --json for scripts.",
)
app.callback()(root_callback)
for _name, _function in (
    ("history", reads.history),
    ("show", reads.show),
    ("describe", reads.describe),
    ("diff", reads.diff),
    ("replay", audits.replay),
    ("changes", changes.changes),
    ("verify", audits.verify),
    ("vacuum", maintenance.vacuum),
    ("optimize", maintenance.optimize),
    ("reorg", maintenance.reorg),
    ("restore", maintenance.restore),
    ("drop-feature", maintenance.drop_feature),
):
    app.command(_name)(with_global_options(_function))

slots_app = typer.Typer(help="The table's version slots (see Table.repair_slots).")
slots_app.command("status")(with_global_options(maintenance.slots_status))
slots_app.command("repair")(with_global_options(maintenance.slots_repair))
app.add_typer(slots_app, name="slots")


def main(argv: Sequence[str] | None = None, *, parse_only: bool = False) -> int:
    """Run the program on ``argv`` (default ``sys.argv[1:]``); return its exit code.

    ``parse_only``: check the arguments and stop before the command runs (0 if they parse,
    2 with the one-line complaint if not); the README test checks its commands this way.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    settings = Settings(parse_only=parse_only)
    command = typer.main.get_command(app)
    try:
        result = command.main(args=args, prog_name=PROG, standalone_mode=False, obj=settings)
    except CLI_ERROR as exc:  # unknown option, bad value, missing argument
        _complain("error", exc.format_message(), _usage_hint(exc))  # type: ignore[attr-defined]
        return int(exc.exit_code)  # type: ignore[attr-defined]
    except typer.Abort:
        _complain("error", "aborted")
        return EXIT_FAILED
    except (EventlogError, LockstoreError) as exc:
        return _failed(exc, settings, exit_code(exc))
    except Exception as exc:  # a bug, or an error of a library below: one line unless --debug
        return _failed(exc, settings, EXIT_FAILED, hint=" (rerun with --debug for the traceback)")
    return result if isinstance(result, int) else EXIT_OK


def exit_code(exc: BaseException) -> int:
    """2 for errors in the user's input, 1 for everything else."""
    return EXIT_BAD_INPUT if isinstance(exc, BAD_INPUT) else EXIT_FAILED


def _failed(exc: BaseException, settings: Settings, code: int, hint: str = "") -> int:
    if settings.debug:
        traceback.print_exception(exc, file=sys.stderr)
        hint = ""
    _complain(type(exc).__name__, str(exc) or repr(exc), hint)
    return code


def _usage_hint(exc: Exception) -> str:
    ctx = getattr(exc, "ctx", None)
    if ctx is None:
        return ""
    return f" (see '{ctx.command_path} --help')"


def _complain(kind: str, message: str, hint: str = "") -> None:
    """One line on stderr: ``eventlog: <kind>: <message>``."""
    line = re.sub(r"\s*\n\s*", " ", message).strip()
    sys.stderr.write(f"{PROG}: {kind}: {line}{hint}\n")
    sys.stderr.flush()


if __name__ == "__main__":
    raise SystemExit(main())
