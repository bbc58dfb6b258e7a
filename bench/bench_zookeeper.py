"""ZooKeeper version slots: commits/s of small appends, claim strategies, and one commit's cost.

Three parts, all against real ZooKeeper servers started by this script on loopback
(``tests.support.zkserver``: a standalone node and a 3-node ensemble, both durable, i.e.
``forceSync=yes``), and all stopped again before it exits, also on failure:

1. **Small appends** -- 1 writer and 4 processes of 1-row blind appends, each run on a fresh
   table, in five configurations (interleaved, so drift in machine load hits all alike):

   * ``embedded``      -- ``Table.append``, default embedded (local-file) slot store
   * ``zk-standalone`` -- ``Table.append`` with ``slots="zk://<standalone>/<fresh chroot>"``
   * ``zk-ensemble``   -- ``Table.append`` with ``slots="zk://<3 nodes>/<fresh chroot>"``
   * ``zk-ensemble-group`` -- the same through the ensemble with ``group_commit=True``
     (concurrent appends may share a version: commits/s counts acknowledged appends)
   * ``deltalake``     -- ``deltalake.write_deltalake(path, batch, mode="append")``

   Writers are "spawn" processes released together by a barrier; throughput = successful
   appends / (last writer's end - first writer's start). Any exception from an append is a
   failed append. After each of our runs the table must hold one row per append, be at
   version == appends (<= with group commit), and carry exactly the acknowledged
   transaction ids, each once (asserted). Targets: 4 processes through the ensemble reach >= 10x
   deltalake's commits/s and >= 0.5x the embedded store's, with no failed append.

2. **Claim strategies** -- plain kazoo against the ensemble, 4 processes each taking
   consecutive slots: ``cas`` (``get(counter)`` then ``transaction(set_data(counter, v+1,
   version), create(slot v+1))``, retried at once on failure), ``seq`` (``create(prefix,
   sequence=True)``) and ``store`` (our ``ZooKeeperSlotStore``: ``latest()`` then
   ``claim(latest+1)`` until granted). Reports slots/s, retries and round trips per slot.

3. **One commit** -- a single writer appending through the ensemble: round trips to
   ZooKeeper per commit (every request counted at ``KazooClient._call``), where the wall time
   goes (ZooKeeper waits, log-file I/O, data-file writes, checkpoints, the rest), then the
   same appends under cProfile.

Run: ``.venv/bin/python bench/bench_zookeeper.py [--quick] [--repeat N] [--parts appends,claims,profile]``
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from bench._common import machine_note
from bench._zk_appends import part_appends
from bench._zk_claims import part_claims
from bench._zk_profile import part_profile, warm_up_appends
from bench._zkcommon import PARTS, loadavg

# ---------------------------------------------------------------------------------------------
# Driver


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (median and range)")
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)} (default: all)"
    )
    parser.add_argument("--top", type=int, default=15, help="rows of the cProfile tables")
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if unknown := set(args.parts) - set(PARTS):
        parser.error(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


def _raise_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop the servers


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from tests.support.zkserver import ZooKeeperEnsemble, ZooKeeperServer

    os.environ.pop("EVENTLOG_SLOTS", None)  # "embedded" must mean the default store
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    sizes = {1: 30, 4: 15} if args.quick else {1: 300, 4: 150}
    claims_per_writer = 30 if args.quick else 300
    profile_appends = 50 if args.quick else 200
    warm_up = 100 if args.quick else 500
    print(f"# bench_zookeeper ({'quick' if args.quick else 'full'}): {machine_note()}")
    print(f"parts: {', '.join(args.parts)}; {args.repeat} runs each")
    standalone = ZooKeeperServer(force_sync=True)
    ensemble = ZooKeeperEnsemble(3, force_sync=True)
    ok = True
    try:
        t0 = time.perf_counter()
        standalone.start()
        ensemble.start()
        print(
            f"ZooKeeper: standalone {standalone.hosts} ({standalone.mode()}); ensemble {ensemble.hosts} "
            f"({', '.join(str(m) for m in ensemble.modes())}); forceSync=yes, tickTime 2000 ms; "
            f"started in {time.perf_counter() - t0:.1f} s"
        )
        hosts = {
            "zk-standalone": standalone.hosts,
            "zk-ensemble": ensemble.hosts,
            "zk-ensemble-group": ensemble.hosts,
        }
        ensemble_pids = [node.pid for node in ensemble.nodes if node.pid is not None]
        pids = {
            "zk-standalone": [p for p in [standalone.pid] if p is not None],
            "zk-ensemble": ensemble_pids,
            "zk-ensemble-group": ensemble_pids,
        }
        for config in ("zk-standalone", "zk-ensemble"):  # the JVMs start cold (C1 JIT)
            t0 = time.perf_counter()
            warm_up_appends(hosts[config], warm_up)
            print(f"warm-up: {warm_up} appends through {config} in {time.perf_counter() - t0:.1f} s")
        if "appends" in args.parts:
            ok = part_appends(hosts, pids, sizes, args.repeat) and ok
        if "claims" in args.parts:
            part_claims(ensemble.hosts, 4, claims_per_writer, args.repeat)
        if "profile" in args.parts:
            part_profile(
                ensemble.hosts, profile_appends, sizes[4], args.repeat, args.top, pids["zk-ensemble"]
            )
    finally:
        try:
            ensemble.close()
        finally:
            standalone.close()
            signal.signal(signal.SIGTERM, previous)
        print(f"servers stopped; loadavg {loadavg()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
