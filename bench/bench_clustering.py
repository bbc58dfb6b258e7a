"""Point queries on a clustering column after OPTIMIZE: liquid clustering against Z-order and
no layout (issue 24).

One table of ``--rows`` rows (default 2,000,000: ``id`` BIGINT drawn at random from 0..10^9,
``v`` DOUBLE, ``s`` STRING) written in random order with ``delta.targetFileSize`` small
enough (24 KiB) that it holds about 1,000 files, copied three times:

* ``none``:      as written (every file spans the whole id range);
* ``zorder``:    ``optimize(zorder_by=["id"])``;
* ``clustered``: ``cluster_by(["id"])``, then ``optimize()`` (clustering OPTIMIZE).

Then ``--queries`` point queries ``id = <a stored id>`` per table: the files a read opens
after min/max skipping (``Table.files(filter=...)``), as a share of the table's files, and
the read's wall time (``to_arrow(filter=...)``), median [min-max]. The OPTIMIZE's wall time
is reported too. Target: the clustered table's point query reads at most 10% of its files.

Run: ``.venv/bin/python bench/bench_clustering.py [--quick] [--repeat N]`` (``--repeat``:
passes over the queries).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import numpy as np
import pyarrow as pa

from bench._common import Stat, machine_note, parse_args, print_table, verdict

QUERIES = 50
TARGET_FILE_SIZE = 24 * 1024


def make_data(rows: int) -> pa.Table:
    rng = np.random.default_rng(24)
    return pa.table(
        {
            "id": pa.array(rng.integers(0, 10**9, rows)),
            "v": pa.array(rng.random(rows)),
            "s": pa.array(np.array(["alpha", "beta", "gamma", "delta"])[rng.integers(0, 4, rows)]),
        }
    )


def main() -> None:
    from eventlog import Table

    args = parse_args(__doc__.splitlines()[0], default_repeat=3, quick_repeat=1)
    rows = 200_000 if args.quick else 2_000_000
    print(machine_note())
    data = make_data(rows)
    root = tempfile.mkdtemp(prefix="bench-clustering-")
    out = []
    try:
        base = f"{root}/base"
        Table.create(base, data=data, properties={"delta.targetFileSize": str(TARGET_FILE_SIZE)}).close()
        rng = np.random.default_rng(7)
        probes = data.column("id").take(pa.array(rng.integers(0, rows, QUERIES))).to_pylist()
        for layout in ("none", "zorder", "clustered"):
            path = f"{root}/{layout}"
            shutil.copytree(base, path, symlinks=True)
            table = Table.open(path)
            started = time.perf_counter()
            if layout == "zorder":
                table.optimize(zorder_by=["id"])
            elif layout == "clustered":
                table.cluster_by(["id"])
                table.optimize()
            optimize_s = time.perf_counter() - started
            total = len(table.files())
            shares, reads = [], []
            for _ in range(args.repeat):
                for probe in probes:
                    shares.append(len(table.files(filter=f"id = {probe}")) / total)
                    began = time.perf_counter()
                    got = table.to_arrow(filter=f"id = {probe}")
                    reads.append(time.perf_counter() - began)
                    assert got.num_rows >= 1
            table.close()
            share = Stat.of(shares)
            out.append(
                [
                    layout,
                    f"{total:,}",
                    f"{optimize_s:.2f}" if layout != "none" else "-",
                    f"{100 * share.median:.2f}% [{100 * share.low:.2f}-{100 * share.high:.2f}]",
                    Stat.of(reads).fmt(".4f"),
                    verdict(share.median <= 0.10) if layout == "clustered" else "",
                ]
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(
        f"{rows:,} rows; {QUERIES} point queries x {args.repeat}; "
        "target: clustered reads <= 10% of its files",
        ["layout", "files", "OPTIMIZE s", "files read per query", "query wall s", "verdict"],
        out,
    )


if __name__ == "__main__":
    main()
