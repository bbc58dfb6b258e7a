"""``python -m eventlog.cli``: table operations from the shell.

    python -m eventlog.cli history URI [--limit N]
    python -m eventlog.cli slots status URI [--slots SPEC]
    python -m eventlog.cli slots repair URI [--slots SPEC] [--dry-run]

``slots repair`` finishes or resolves incomplete version slots (see
:meth:`eventlog.table.Table.repair_slots`); what it does lands in the commit log.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from eventlog.table import Table
from lockstore.cli import slot_report


def _dump(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eventlog.cli", description="eventlog table operations")
    sub = parser.add_subparsers(dest="command", required=True)
    history = sub.add_parser("history", help="commitInfo of each version, newest first")
    history.add_argument("uri")
    history.add_argument("--limit", type=int, default=20)
    history.add_argument("--slots", default=None)
    slots = sub.add_parser("slots", help="the table's version slots")
    slots_sub = slots.add_subparsers(dest="slots_command", required=True)
    for name in ("status", "repair"):
        cmd = slots_sub.add_parser(name)
        cmd.add_argument("uri")
        cmd.add_argument(
            "--slots", default=None, help="slot store spec (default: the table's embedded store)"
        )
        cmd.add_argument("--limit", type=int, default=100)
        if name == "repair":
            cmd.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    # The slots commands must see the slots before reading the log would finish them.
    table = (
        Table.open(args.uri, slots=args.slots)
        if args.command == "history"
        else Table.handle(args.uri, args.slots)
    )
    if args.command == "history":
        _dump(table.history(args.limit))
    elif args.slots_command == "status":
        _dump(slot_report(table.slots, table.key, limit=args.limit))
    else:
        _dump(table.repair_slots(dry_run=args.dry_run, limit=args.limit))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
