"""UPDATE, DELETE and MERGE over a ~2 GB table in many files: peak RSS and time, eventlog
against ``deltalake`` (issue 27: DML works file by file, its memory bounded by the largest
touched file, not the table).

One table is written once under /tmp (eventlog, no deletion vectors) in ``--files`` files;
each run copies it afresh and runs one operation in a fresh child process, which prints its
peak RSS (``ru_maxrss``), wall and CPU time. ``deltalake`` runs the same operation on a copy
of the same table (a Delta table: the same files and log). Engines alternate, the first
alternating per run; the medians [min-max] of ``--repeat`` runs are reported. Every
operation touches every file:

* UPDATE ``grp = 3`` (a seventh of the rows): ``v = v + 1``;
* DELETE ``grp = 3`` (rewrites: no deletion vectors);
* MERGE of every 50th id (``v`` replaced) plus 10,000 new ids (inserted).

The child that only imports both libraries and opens the table gives the baseline RSS.
Everything under /tmp is deleted at the end.

    .venv/bin/python bench/bench_dml_memory.py [--quick] [--repeat N] [--gb 2] [--files 64] [--old DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

OPS = ("update", "delete", "merge")
ENGINES = ("eventlog", "deltalake")
ROW_BYTES = 8 + 8 + 8 + 100 + 4  # id, grp, v, payload and its offset, in memory


def _batch(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    rng = np.random.default_rng(start)
    letters = rng.integers(97, 123, size=(n, 88), dtype=np.uint8)
    powers = 10 ** np.arange(11, -1, -1, dtype=np.int64)
    prefix = ((ids[:, None] // powers) % 10 + 48).astype(np.uint8)  # the id, 12 digits
    payload = np.concatenate([prefix, letters], axis=1).reshape(-1)
    offsets = pa.array(np.arange(0, 100 * (n + 1), 100, dtype=np.int32))
    strings = pa.StringArray.from_buffers(n, offsets.buffers()[1], pa.py_buffer(payload.tobytes()))
    return pa.table({"id": ids, "grp": ids % 7, "v": ids.astype(np.float64), "payload": strings})


def _source(total: int) -> pa.Table:
    ids = np.concatenate([np.arange(0, total, 50), np.arange(total, total + 10_000)]).astype(np.int64)
    return pa.table({"id": ids, "grp": ids % 7, "v": -ids.astype(np.float64), "payload": ["s"] * len(ids)})


def _child(engine: str, op: str, path: str, total: int) -> None:
    """One operation in this fresh process; prints its peak RSS and times as JSON."""
    import deltalake  # both imported in every child: the same baseline

    from eventlog import Table

    source = _source(total) if op == "merge" else None
    wall0, cpu0 = time.perf_counter(), time.process_time()
    if engine == "eventlog":
        t = Table.open(path)
        if op == "update":
            t.update("grp = 3", {"v": "v + 1"})
        elif op == "delete":
            t.delete("grp = 3")
        elif op == "merge":
            m = t.merge(source, "target.id = source.id")
            m.when_matched_update(set={"v": "source.v"}).when_not_matched_insert_all().execute()
    else:
        dt = deltalake.DeltaTable(path)
        if op == "update":
            dt.update(predicate="grp = 3", updates={"v": "v + 1"})
        elif op == "delete":
            dt.delete("grp = 3")
        elif op == "merge":
            m = dt.merge(source, predicate="t.id = s.id", source_alias="s", target_alias="t")
            m.when_matched_update(updates={"v": "s.v"}).when_not_matched_insert_all().execute()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"rss_mb": rss_mb, "wall": wall, "cpu": cpu}), flush=True)


def _run_child(engine: str, op: str, path: str, total: int, code: str | None = None) -> dict[str, float]:
    """``op`` by ``engine`` in a fresh process; ``code``: a checkout of eventlog to import instead."""
    env = dict(os.environ, PYTHONPATH=code) if code else None
    out = subprocess.run(
        [sys.executable, __file__, "--child", engine, op, path, str(total)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if out.returncode:
        raise RuntimeError(f"{engine} {op} failed:\n{out.stderr[-3000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _build(path: str, gb: float, files: int) -> tuple[int, int]:
    """The table: ``files`` appends of equal batches, about ``gb`` GB in memory; (rows, bytes on disk)."""
    from eventlog import Table

    per_file = int(gb * 1e9 / ROW_BYTES / files)
    t = Table.create(path, _batch(0, 0).schema, properties={"delta.enableDeletionVectors": "false"})
    for i in range(files):
        t.append(_batch(i * per_file, per_file))
    size = sum(f.stat().st_size for f in Path(path).rglob("*.parquet"))
    return per_file * files, size


def _median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _fmt(values: list[float], spec: str) -> str:
    return f"{statistics.median(values):{spec}} [{min(values):{spec}}-{max(values):{spec}}]"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small table (smoke run)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--gb", type=float, default=2.0, help="table size in memory (Arrow bytes)")
    parser.add_argument("--files", type=int, default=64)
    parser.add_argument(
        "--old",
        metavar="DIR",
        help="also run eventlog imported from DIR (an older checkout, e.g. `git archive REV eventlog`), once",
    )
    args = parser.parse_args()
    if args.quick:
        args.gb, args.files, args.repeat = 0.05, 8, 1
    work = tempfile.mkdtemp(prefix="bench_dml_memory_", dir="/tmp")
    try:
        base = os.path.join(work, "base")
        total, disk = _build(base, args.gb, args.files)
        print(
            f"table: {total:,} rows in {args.files} files, {total * ROW_BYTES / 1e9:.2f} GB in memory, "
            f"{disk / 1e9:.2f} GB of Parquet",
            flush=True,
        )
        results: dict[tuple[str, str], list[dict[str, float]]] = {}
        for engine in ENGINES:
            results[(engine, "open")] = [_run_child(engine, "open", base, total)]
        for rep in range(args.repeat):
            for op in OPS:
                order = ENGINES if rep % 2 == 0 else ENGINES[::-1]
                for engine in order:
                    copy = os.path.join(work, f"{engine}-{op}-{rep}")
                    shutil.copytree(base, copy, symlinks=True)  # the slots are links
                    got = _run_child(engine, op, copy, total)
                    shutil.rmtree(copy)
                    results.setdefault((engine, op), []).append(got)
                    print(f"run {rep + 1} {op} {engine}: {got}", flush=True)
        engines = list(ENGINES)
        if args.old:
            engines.append("eventlog (old)")
            for op in OPS:
                copy = os.path.join(work, f"old-{op}")
                shutil.copytree(base, copy, symlinks=True)
                got = _run_child("eventlog", op, copy, total, code=args.old)
                shutil.rmtree(copy)
                results[("eventlog (old)", op)] = [got]
                print(f"old {op} eventlog: {got}", flush=True)
            results[("eventlog (old)", "open")] = [_run_child("eventlog", "open", base, total, code=args.old)]
        print()
        print("| operation | engine | peak RSS MB | wall s | CPU s |")
        print("|---|---|---|---|---|")
        for op in ("open", *OPS):
            for engine in engines:
                rs = results[(engine, op)]
                print(
                    f"| {op} | {engine} | {_fmt([r['rss_mb'] for r in rs], '.0f')} | "
                    f"{_fmt([r['wall'] for r in rs], '.1f')} | {_fmt([r['cpu'] for r in rs], '.1f')} |"
                )
        print()
        for op in OPS:
            ev, dl = results[("eventlog", op)], results[("deltalake", op)]
            med = {k: (_median(ev, k), _median(dl, k)) for k in ev[0]}
            print(
                f"{op}: eventlog / deltalake: peak RSS {med['rss_mb'][0] / med['rss_mb'][1]:.2f}x, "
                f"wall {med['wall'][0] / med['wall'][1]:.2f}x, CPU {med['cpu'][0] / med['cpu'][1]:.2f}x"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
