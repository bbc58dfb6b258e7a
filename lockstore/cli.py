"""``python -m lockstore.cli status --slots SPEC --table KEY``: a table's version slots.

Prints the latest claimed version, the incomplete slots (claimed, not yet marked
published) with their owner, age and whether the owner is provably alive, and the live
writer sessions. Read-only; repairs go through ``python -m eventlog.cli slots repair``,
which also writes what it did to the table's commit log.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from lockstore.base import SlotStore
from lockstore.registry import open_slot_store


def slot_report(store: SlotStore, table: str, *, limit: int = 100) -> dict[str, Any]:
    """The operations view of one table's slots (JSON-serialisable)."""
    incomplete = []
    for record in store.recent(table, limit=limit, incomplete_only=True):
        incomplete.append(
            {
                "version": record.version,
                "txn_id": record.claim.txn_id,
                "owner": dict(record.claim.owner),
                "staged": record.claim.staged,
                "age_seconds": round(record.age, 3),
                "owner_alive": store.owner_alive(table, record.version),
            }
        )
    return {
        "table": table,
        "latest": store.latest(table),
        "incomplete": incomplete,
        "sessions": store.sessions(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lockstore.cli", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="latest version, incomplete slots, sessions")
    status.add_argument("--slots", required=True, help="slot store spec, e.g. zk://host:2181/eventlog")
    status.add_argument("--table", required=True, help="the table key (its normalised URI)")
    status.add_argument("--limit", type=int, default=100, help="how many recent slots to inspect")
    args = parser.parse_args(argv)
    store = open_slot_store(args.slots)  # shared per process, closed at exit
    json.dump(slot_report(store, args.table, limit=args.limit), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
