"""Change data feed overhead on DELETE, UPDATE and MERGE (issue 24).

A table of ``--rows`` rows (default 1,000,000: id BIGINT, p STRING with 10 partitions'
worth of values, v BIGINT, s STRING) in 10 data files, unpartitioned, built once per
variant as a master; each operation runs on a fresh copy of a master (copy not timed), with
the change data feed off (``plain``) and on (``cdf``), side by side:

* DELETE ``id % 100 = 7`` (1% of the rows, in every file);
* UPDATE ``SET v = v + 1 WHERE id % 100 = 7``;
* MERGE of a 10,000-row source (half matching ids, updated; half new, inserted).

Each is measured on tables with deletion vectors (``dv``: the deleted or updated rows are
marked in DVs; with the feed on they are also read and written to a change file) and
without (``rewrite``: the touched files are rewritten; the change file holds the changed
rows). Runs alternate between plain and cdf, the first rotating; wall and CPU time (user +
system, all threads) are the median [min-max] of ``--repeat`` runs. Target: cdf / plain
<= 1.3x.

Run: ``.venv/bin/python bench/bench_change_data.py [--quick] [--repeat N]``
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import numpy as np
import pyarrow as pa

from bench._common import Stat, machine_note, parse_args, print_table, ratio, rotated, verdict, wall_and_cpu

FILES = 10


def make_data(rows: int) -> pa.Table:
    rng = np.random.default_rng(24)
    return pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "p": pa.array(np.array([f"p{i}" for i in range(10)])[rng.integers(0, 10, rows)]),
            "v": pa.array(rng.integers(0, 1_000_000, rows)),
            "s": pa.array(np.array(["alpha", "beta", "gamma", "delta"])[rng.integers(0, 4, rows)]),
        }
    )


def build_master(root: str, name: str, data: pa.Table, *, dv: bool, cdf: bool) -> str:
    from eventlog import Table

    path = f"{root}/master-{name}"
    props = {"delta.enableDeletionVectors": str(dv).lower(), "delta.enableChangeDataFeed": str(cdf).lower()}
    t = Table.create(path, data.schema, properties=props)
    step = -(-data.num_rows // FILES)
    for start in range(0, data.num_rows, step):
        t.append(data.slice(start, step))
    t.close()
    return path


def operations(rows: int) -> dict[str, Callable[[object], object]]:
    n = max(2, rows // 100)
    source = pa.table(
        {
            "id": pa.array(np.concatenate([np.arange(0, n // 2) * 97, rows + np.arange(n // 2)]), pa.int64()),
            "p": pa.array(["new"] * n),
            "v": pa.array(np.arange(n, dtype=np.int64)),
            "s": pa.array(["omega"] * n),
        }
    )

    def merge(t: object) -> object:
        return (
            t.merge(source, "target.id = source.id")  # type: ignore[attr-defined]
            .when_matched_update(set={"v": "source.v"})
            .when_not_matched_insert_all()
            .execute()
        )

    return {
        "DELETE": lambda t: t.delete("id % 100 = 7"),  # type: ignore[attr-defined]
        "UPDATE": lambda t: t.update("id % 100 = 7", {"v": "v + 1"}),  # type: ignore[attr-defined]
        "MERGE": merge,
    }


def run_once(master: str, scratch: str, op: Callable[[object], object]) -> tuple[float, float]:
    from eventlog import Table

    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(master, scratch, symlinks=True)
    table = Table.open(scratch)
    wall, cpu = wall_and_cpu(lambda: op(table))
    table.close()
    return wall, cpu


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], default_repeat=5, quick_repeat=1)
    rows = 50_000 if args.quick else 1_000_000
    print(machine_note())
    data = make_data(rows)
    root = tempfile.mkdtemp(prefix="bench-cdf-")
    table_rows = []
    try:
        masters = {
            (layout, kind): build_master(root, f"{layout}-{kind}", data, dv=layout == "dv", cdf=kind == "cdf")
            for layout in ("dv", "rewrite")
            for kind in ("plain", "cdf")
        }
        ops = operations(rows)
        for layout in ("dv", "rewrite"):
            for name, op in ops.items():
                walls: dict[str, list[float]] = {"plain": [], "cdf": []}
                cpus: dict[str, list[float]] = {"plain": [], "cdf": []}
                for kind in ("plain", "cdf"):  # warm-up, not timed: lazy imports, caches
                    run_once(masters[(layout, kind)], f"{root}/run", op)
                for rep in range(args.repeat):
                    for kind in rotated(["plain", "cdf"], rep):
                        wall, cpu = run_once(masters[(layout, kind)], f"{root}/run", op)
                        walls[kind].append(wall)
                        cpus[kind].append(cpu)
                w = {k: Stat.of(v) for k, v in walls.items()}
                c = {k: Stat.of(v) for k, v in cpus.items()}
                wr, cr = ratio(w["cdf"].median, w["plain"].median), ratio(c["cdf"].median, c["plain"].median)
                table_rows.append(
                    [
                        f"{name} ({layout})",
                        w["plain"].fmt(".3f"),
                        w["cdf"].fmt(".3f"),
                        f"{wr:.2f}x",
                        c["plain"].fmt(".3f"),
                        c["cdf"].fmt(".3f"),
                        f"{cr:.2f}x",
                        verdict(wr <= 1.3),
                    ]
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(
        f"{rows:,} rows in {FILES} files, {args.repeat} runs each (median [min-max], seconds); "
        "target cdf <= 1.3x",
        ["operation", "plain wall", "cdf wall", "ratio", "plain CPU", "cdf CPU", "ratio", "verdict"],
        table_rows,
    )


if __name__ == "__main__":
    main()
