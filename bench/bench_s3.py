"""Tables on S3 (a local moto server): small appends and bulk write/scan, ours versus delta-rs.

Starts moto's standalone S3 server on a loopback port (``tests.support.s3server.MotoS3Server``:
a Python emulator in its own process, every PUT/POST/DELETE serialized under one lock so that
conditional writes are atomic) and stops it at the end. Only fake credentials are used: every
``AWS_*`` variable is removed from this process's environment and ``testing`` keys are set.
moto is not AWS: its latency and throughput are those of a Python web app sharing this
machine's cores with the client. What matters is the ratio ours / deltalake on the same
server, and S3 / local for each engine.

Four configurations (``deltalake-local`` is a reference for deltalake's own S3 / local ratio):

* ``ours-local``      -- a local path, the default embedded (local-file) slot store
* ``ours-s3``         -- ``s3://<bucket>/...`` with ``storage_options={"endpoint_url", "key",
  "secret"}`` and ``slots=lockstore.InMemorySlotStore()``: one process only (an object-store
  table has no default slot store; several machines would need ZooKeeper slots)
* ``deltalake-s3``    -- the same server, ``storage_options`` ``AWS_ENDPOINT_URL``, keys, region,
  ``AWS_ALLOW_HTTP`` (deltalake >= 1.0 commits with ``If-None-Match: *``, which moto honours)
* ``deltalake-local`` -- a local path

Measurements, each ``--repeat`` times on fresh tables, configurations interleaved with the
first one rotating from run to run, ``gc.collect()`` (and ``os.sync()``) before each timed call:

1. small appends: N one-row appends (200; ``--quick`` 30). Ours through one handle
   (``Table.open(...).append(batch)``), deltalake ``write_deltalake(uri, batch, mode="append")``
   (each call loads the table's log, as a user of that API pays). commits/s, ms/commit, CPU
   ms/commit of this process (all threads) and of the S3 server. Afterwards the version must be
   N and the table must hold N rows.
2. bulk write: one append of 2,000,000 rows (``--quick`` 200,000; columns ``id int64, value
   float64, name string, ts timestamp[us, UTC], count int32``, built by ``bench_bulk.make_data``)
   into a new table (ours: ``Table.create`` untimed, then the timed ``append``; deltalake:
   ``write_deltalake`` creating the table). MB/s = Arrow ``nbytes`` / seconds.
3. full scan of the tables just written: ``Table.open(...).to_arrow()`` versus
   ``DeltaTable(...).to_pyarrow_table()`` (handle / DeltaTable made beforehand); row count and
   ``sum(id)`` are checked.
4. open: a table of C one-row commits (``--open-commits``, default 100; ``--quick`` 20; versions
   0..C-1; ``delta.checkpointInterval`` 1,000,000, so no automatic checkpoint), then the same
   table with a checkpoint at its version C-1 (``Table.checkpoint()`` / ``create_checkpoint()``,
   nothing after it). Each is opened ``--opens`` times per run (default 3), configurations
   interleaved: ``Table.open(uri)`` versus ``DeltaTable(uri)`` (both read the whole snapshot,
   file list included); the per-run median is kept. The opened version is checked. The tables
   are built untimed (deltalake through one ``DeltaTable``). (The automatic checkpoints differ:
   ours at versions that are multiples of the interval, delta-rs at version+1 multiples.)

Then, on a second server that logs every request, S3 requests are counted for ``ours-s3``,
``deltalake-s3`` and ``deltalake-s3-handle`` (by HTTP method; GET split into object reads and
listings): per small append (mean of N, after a first untimed one), per open of the table those
appends made (``Table.open`` / ``DeltaTable(uri)``), create + bulk write, and open + full scan
of the bulk table, and the two opens of measurement 4. ``--profile`` adds a cProfile of ours-s3
small appends (top functions).

Client and server cost. moto is a Python web app: each request costs it about as much CPU as
the client spends making it. Every timing therefore also reports the S3 server process's CPU
time (``/proc/<pid>/stat``, all its threads) and its share of the wall time: requests are
sequential, so that share is (roughly) wall time a faster server would not cost. The load
average is printed before every run: the machine is shared, and other jobs' CPU use shows up
as wall time above client + server CPU.

Run: ``.venv/bin/python bench/bench_s3.py [--quick] [--repeat N] [--profile]``
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from bench._common import Stat, machine_note, print_table, ratio, rotated
from bench._s3_requests import REQUEST_OPERATIONS, request_counts
from bench._s3_runs import profile_small, run_bulk, run_open, run_small, warm_up
from bench._s3common import (
    CONFIGS,
    SMALL_CONFIGS,
    Place,
    Timing,
    fake_aws_env,
    is_s3,
    loadavg,
    make_bucket,
    share,
)
from bench._s3common import server_cpu as server_cpu  # re-exported: bench_native_s3 imports it from here
from bench.bench_bulk import make_data
from tests.support.s3server import MotoS3Server


def parse_args() -> argparse.Namespace:
    """``--quick``, ``--repeat N`` (default 3, quick 1) and ``--profile``."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run (< 60 s)")
    parser.add_argument("--repeat", type=int, default=None, help="runs per measurement (default 3, quick 1)")
    parser.add_argument("--profile", action="store_true", help="cProfile ours-s3 small appends")
    parser.add_argument(
        "--open-commits", type=int, default=None,
        help="commits of the table whose open is timed (default 100, quick 20); one more: a checkpoint",
    )  # fmt: skip
    parser.add_argument("--opens", type=int, default=3, help="timed opens per table and run (default 3)")
    args = parser.parse_args()
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.open_commits is None:
        args.open_commits = 20 if args.quick else 100
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.open_commits < 2 or args.opens < 1:
        parser.error("--open-commits must be at least 2 and --opens at least 1")
    return args


# --------------------------------------------------------------------------- main


def main() -> int:
    args = parse_args()
    n_small = 30 if args.quick else 200
    rows = 200_000 if args.quick else 2_000_000
    fake_aws_env()
    print(f"# bench_s3 ({'quick' if args.quick else 'full'}): {machine_note()}")
    print(
        "note: the S3 server is moto, a Python emulator in a separate local process on the same cores "
        "(writes serialized under one lock); its latency and throughput are not AWS's. Compare the "
        "ratios ours / deltalake on the same server and S3 / local."
    )
    print("note: ours-s3 uses slots=InMemorySlotStore(): valid for writers in one process only.")
    data = make_data(rows)
    mb = data.nbytes / 1e6
    print(
        f"sizes: {n_small} one-row appends per run; bulk {rows:,} rows = {mb:.1f} MB in Arrow; "
        f"opens of {args.open_commits} commits and at a checkpoint, {args.opens} per run; "
        f"{args.repeat} runs each"
    )

    small: dict[str, list[Timing]] = {c: [] for c in SMALL_CONFIGS}
    writes: dict[str, list[Timing]] = {c: [] for c in CONFIGS}
    scans: dict[str, list[Timing]] = {c: [] for c in CONFIGS}
    files: dict[str, tuple[int, int]] = {}
    opens_log: dict[str, list[Timing]] = {c: [] for c in CONFIGS}
    opens_ckpt: dict[str, list[Timing]] = {c: [] for c in CONFIGS}
    commits = args.open_commits
    loads: list[str] = []
    local_root = tempfile.mkdtemp(prefix="bench-s3-")
    try:
        with MotoS3Server() as server:
            print(
                f"S3 server: {server.endpoint_url} (pid {server.pid}, up in {server.startup_seconds:.1f} s)"
            )
            place = Place(server.endpoint_url, make_bucket(server.endpoint_url), local_root)
            warm_up(place, server, data.slice(0, 1000))
            for rep in range(args.repeat):
                loads.append(loadavg())
                for config in rotated(SMALL_CONFIGS, rep):
                    small[config].append(run_small(config, place, server, n_small, rep))
                wrote, scanned = run_bulk(place, server, data, rep, files)
                for config in CONFIGS:
                    writes[config].append(wrote[config])
                    scans[config].append(scanned[config])
                plain, ckpt = run_open(place, server, commits, args.opens, rep)
                for config in CONFIGS:
                    opens_log[config].append(plain[config])
                    opens_ckpt[config].append(ckpt[config])
                print(
                    f"  run {rep + 1} (load {loads[-1]}): appends/s "
                    + ", ".join(f"{c} {n_small / small[c][-1].seconds:.0f}" for c in SMALL_CONFIGS)
                    + "; write MB/s "
                    + ", ".join(f"{c} {mb / wrote[c].seconds:.0f}" for c in CONFIGS)
                    + "; scan MB/s "
                    + ", ".join(f"{c} {mb / scanned[c].seconds:.0f}" for c in CONFIGS)
                    + f"; open ms ({commits} commits / checkpoint) "
                    + ", ".join(
                        f"{c} {1000 * plain[c].seconds:.0f} / {1000 * ckpt[c].seconds:.0f}" for c in CONFIGS
                    ),
                    flush=True,
                )
            profile = profile_small(place, n_small) if args.profile else ""
        requests = request_counts(n_small, data, args.open_commits)
    finally:
        shutil.rmtree(local_root, ignore_errors=True)

    # ---- small appends
    cps = {c: Stat.of([n_small / t.seconds for t in small[c]]) for c in SMALL_CONFIGS}
    rows_small = []
    for c in SMALL_CONFIGS:
        rows_small.append(
            [
                c,
                cps[c].fmt(".0f"),
                Stat.of([1000 * t.seconds / n_small for t in small[c]]).fmt(".2f"),
                Stat.of([1000 * t.cpu / n_small for t in small[c]]).fmt(".2f"),
                Stat.of([1000 * t.server_cpu / n_small for t in small[c]]).fmt(".2f") if is_s3(c) else "-",
                share(small[c], "cpu"),
                share(small[c], "server_cpu") if is_s3(c) else "-",
                f"{ratio(cps['ours-s3'].median, cps[c].median):.2f}x",
            ]
        )
    print_table(
        f"Small appends: {n_small} one-row appends, median [min-max] of {args.repeat}",
        ["config", "commits/s", "ms/commit", "client CPU ms/commit", "S3 server CPU ms/commit",
         "client CPU / wall", "server CPU / wall", "ours-s3 / config (commits/s)"],
        rows_small,
    )  # fmt: skip

    # ---- bulk
    w = {c: Stat.of([t.seconds for t in writes[c]]) for c in CONFIGS}
    s = {c: Stat.of([t.seconds for t in scans[c]]) for c in CONFIGS}
    rows_bulk = []
    for phase, st, runs in (("write", w, writes), ("full scan", s, scans)):
        for c in CONFIGS:
            rows_bulk.append(
                [
                    phase,
                    c,
                    st[c].fmt(".2f"),
                    f"{mb / st[c].median:.0f} [{mb / st[c].high:.0f}-{mb / st[c].low:.0f}]",
                    Stat.of([t.cpu for t in runs[c]]).fmt(".2f"),
                    Stat.of([t.server_cpu for t in runs[c]]).fmt(".2f") if is_s3(c) else "-",
                    share(runs[c], "server_cpu") if is_s3(c) else "-",
                    f"{files[c][0]} / {files[c][1] / 1e6:.0f} MB" if phase == "write" else "",
                ]
            )
    print_table(
        f"Bulk write and full scan of {rows:,} rows ({mb:.0f} MB in Arrow), "
        f"median [min-max] of {args.repeat}",
        ["phase", "config", "seconds", "MB/s", "client CPU s", "S3 server CPU s", "server CPU / wall",
         "data files / bytes"],
        rows_bulk,
    )  # fmt: skip

    # ---- opens
    o_log = {c: Stat.of([t.seconds for t in opens_log[c]]) for c in CONFIGS}
    o_ckpt = {c: Stat.of([t.seconds for t in opens_ckpt[c]]) for c in CONFIGS}
    rows_open = []
    for label, st, runs in (
        (f"{commits} commits, no checkpoint (v{commits - 1})", o_log, opens_log),
        (f"{commits} commits, checkpoint at v{commits - 1}", o_ckpt, opens_ckpt),
    ):
        for c in CONFIGS:
            rows_open.append(
                [
                    label,
                    c,
                    Stat.of([1000 * t.seconds for t in runs[c]]).fmt(".1f"),
                    Stat.of([1000 * t.cpu for t in runs[c]]).fmt(".1f"),
                    Stat.of([1000 * t.server_cpu for t in runs[c]]).fmt(".1f") if is_s3(c) else "-",
                    share(runs[c], "server_cpu") if is_s3(c) else "-",
                    f"{ratio(st[c].median, st['ours-s3'].median):.2f}x",
                ]
            )
    print_table(
        f"Open (Table.open / DeltaTable(uri)), median [min-max] over {args.repeat} runs of the "
        f"per-run median of {args.opens} opens",
        ["table", "config", "ms/open", "client CPU ms", "S3 server CPU ms", "server CPU / wall",
         "ours-s3 speed / config"],
        rows_open,
    )  # fmt: skip

    # ---- ratios
    # Throughputs (higher is faster) per measurement and configuration.
    throughput: dict[str, dict[str, float]] = {
        "small appends (commits/s)": {c: cps[c].median for c in SMALL_CONFIGS},
        "small appends, deltalake through one DeltaTable": {
            **{c: cps[c].median for c in SMALL_CONFIGS},
            "deltalake-s3": cps["deltalake-s3-handle"].median,
        },
        "bulk write (MB/s)": {c: mb / w[c].median for c in CONFIGS},
        "full scan (MB/s)": {c: mb / s[c].median for c in CONFIGS},
        f"open, {commits} commits (opens/s)": {c: 1 / o_log[c].median for c in CONFIGS},
        "open at a checkpoint (opens/s)": {c: 1 / o_ckpt[c].median for c in CONFIGS},
    }
    ratio_rows = []
    for label, t in throughput.items():
        ratio_rows.append(
            [
                label,
                f"{ratio(t['ours-s3'], t['deltalake-s3']):.2f}x",
                f"{ratio(t['ours-local'], t['deltalake-local']):.2f}x",
                f"{ratio(t['ours-s3'], t['ours-local']):.2f}x",
                f"{ratio(t['deltalake-s3'], t['deltalake-local']):.2f}x",
            ]
        )
    print_table(
        "Throughput ratios (medians; > 1 means the first is faster)",
        ["measurement", "ours-s3 / deltalake-s3", "ours-local / deltalake-local", "ours: S3 / local",
         "deltalake: S3 / local"],
        ratio_rows,
    )  # fmt: skip

    # ---- requests
    kinds = sorted({k for counts in requests.values() for k in counts}, key=lambda k: (k[0] == "(", k))
    req_rows = []
    order = list(REQUEST_OPERATIONS)
    for (config, what), counts in sorted(requests.items(), key=lambda kv: (order.index(kv[0][1]), kv[0][0])):
        per = n_small if what == "append" else 1
        req_rows.append(
            [
                config,
                REQUEST_OPERATIONS[what]
                .replace("N+1", str(n_small + 1))
                .replace("N", str(n_small))
                .replace("C commits", f"{commits} commits"),
            ]
            + [f"{counts[k] / per:.2f}".rstrip("0").rstrip(".") if counts[k] else "0" for k in kinds]
            + [f"{sum(v for k, v in counts.items() if not k.startswith('(')) / per:.2f}"]
        )
    print_table(
        "S3 requests (server log; LIST = GET with a list query; '(X 404)' etc. are included in X)",
        ["config", "operation", *kinds, "total"],
        req_rows,
    )
    if profile:
        print("### cProfile: ours-s3 small appends\n\n```\n" + profile.rstrip() + "\n```")
    print(f"verification: every small-append run reached version {n_small} with {n_small} rows; every scan "
          f"returned {rows:,} rows with the written sum(id); every open saw version {commits - 1} "
          f"(checkpoint file present for the second) -> OK")  # fmt: skip
    print(f"load average at the end: {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
