"""Constraint and generated-column overhead on a bulk append (issue 23).

A 2,000,000-row append (one ``Table.append`` of an Arrow table) to two fresh tables, side by
side:

* ``plain``: id BIGINT, ts TIMESTAMP, amount DOUBLE, category STRING, d DATE (d supplied by
  the data, no rules);
* ``rules``: the same columns, with 2 CHECK constraints (``amount >= 0 AND amount < 1e9``,
  ``category IN ('a', 'b', 'c', 'd') AND length(category) = 1``) and ``d`` a generated column
  (``CAST(ts AS DATE)``) left out of the data, so it is computed on write.

Both tables are unpartitioned (the write cost is the same; partitioning by ``d`` would add the
same per-file cost to both). Runs alternate, the first table rotating per run; wall and CPU
time (user + system, all threads) are reported as median [min-max]. Target: rules / plain
<= 1.2x.

Run: ``.venv/bin/python bench/bench_constraints.py [--quick] [--repeat N]``
"""

from __future__ import annotations

import datetime as dt
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import numpy as np
import pyarrow as pa

from bench._common import Stat, machine_note, parse_args, print_table, ratio, rotated, verdict, wall_and_cpu

COLUMNS = [
    pa.field("id", pa.int64()),
    pa.field("ts", pa.timestamp("us", "UTC")),
    pa.field("amount", pa.float64()),
    pa.field("category", pa.string()),
]
PLAIN = pa.schema([*COLUMNS, pa.field("d", pa.date32())])
RULES = pa.schema(
    [*COLUMNS, pa.field("d", pa.date32(), metadata={"delta.generationExpression": "CAST(ts AS DATE)"})]
)
CHECKS = {
    "amount_range": "amount >= 0 AND amount < 1e9",
    "category_known": "category IN ('a', 'b', 'c', 'd') AND length(category) = 1",
}


def make_data(rows: int) -> pa.Table:
    rng = np.random.default_rng(23)
    start = int(dt.datetime(2024, 1, 1, tzinfo=dt.UTC).timestamp() * 1_000_000)
    ts = start + rng.integers(0, 90 * 86_400 * 1_000_000, rows)
    return pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "ts": pa.array(ts, pa.timestamp("us", "UTC")),
            "amount": pa.array(rng.random(rows) * 1000.0),
            "category": pa.array(np.array(["a", "b", "c", "d"])[rng.integers(0, 4, rows)]),
        }
    )


def run_once(kind: str, root: str, data: pa.Table) -> tuple[float, float]:
    from eventlog import Table

    path = f"{root}/{kind}"
    shutil.rmtree(path, ignore_errors=True)
    if kind == "plain":
        table = Table.create(path, PLAIN)
        batch = data.append_column("d", data.column("ts").cast(pa.date32()))
    else:
        table = Table.create(path, RULES)
        for name, sql in CHECKS.items():
            table.add_constraint(name, sql)
        batch = data
    wall, cpu = wall_and_cpu(lambda: table.append(batch))
    assert table.to_arrow(columns=["d"]).num_rows == data.num_rows
    table.close()
    return wall, cpu


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], default_repeat=5, quick_repeat=2)
    rows = 100_000 if args.quick else 2_000_000
    print(machine_note())
    data = make_data(rows)
    walls: dict[str, list[float]] = {"plain": [], "rules": []}
    cpus: dict[str, list[float]] = {"plain": [], "rules": []}
    root = tempfile.mkdtemp(prefix="bench-constraints-")
    try:
        for rep in range(args.repeat):
            for kind in rotated(["plain", "rules"], rep):
                wall, cpu = run_once(kind, root, data)
                walls[kind].append(wall)
                cpus[kind].append(cpu)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    wall = {k: Stat.of(v) for k, v in walls.items()}
    cpu = {k: Stat.of(v) for k, v in cpus.items()}
    wall_ratio = ratio(wall["rules"].median, wall["plain"].median)
    cpu_ratio = ratio(cpu["rules"].median, cpu["plain"].median)
    print_table(
        f"bulk append of {rows:,} rows, {args.repeat} runs each (median [min-max], seconds)",
        ["measure", "plain", "2 CHECKs + 1 generated column", "ratio", "target", "verdict"],
        [
            [
                "wall",
                wall["plain"].fmt(".3f"),
                wall["rules"].fmt(".3f"),
                f"{wall_ratio:.2f}x",
                "<= 1.2x",
                verdict(wall_ratio <= 1.2),
            ],
            [
                "CPU",
                cpu["plain"].fmt(".3f"),
                cpu["rules"].fmt(".3f"),
                f"{cpu_ratio:.2f}x",
                "<= 1.2x",
                verdict(cpu_ratio <= 1.2),
            ],
        ],
    )


if __name__ == "__main__":
    main()
