"""A slow disk (issue 28): writer processes in durable mode on the power-loss file system
with a delay on every operation and more on every fsync (one slow device: the daemon
serves one operation at a time). The writers finish in bounded time, the invariants
hold, ``verify`` passes and a new write is accepted; then the power is cut and every
acknowledged commit is still there."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from eventlog import Table
from tests.support.invariants import SCHEMA
from tests.support.powerloss import PowerLossMount
from tests.support.powerloss_writers import Writers, all_acks, check_durable_image

WORKERS = 3
OPS = 4
DELAY = 0.002  # seconds per operation
SYNC_DELAY = 0.01  # seconds more per fsync


@pytest.mark.timeout(150)
def test_writers_on_a_slow_disk_keep_the_invariants(tmp_path: Path) -> None:
    with PowerLossMount(tmp_path / "mnt") as mount:
        uri = str(mount.mountpoint / "t")
        Table.create(uri, schema=SCHEMA, durable=True).close()
        mount.set_delay(DELAY, SYNC_DELAY)
        before = mount.stats()
        started = time.monotonic()
        writers = Writers(uri, WORKERS, tmp_path / "logs", durable=True, seed=5, max_ops=OPS)
        try:
            writers.join(timeout=100)
        finally:
            writers.kill()
        elapsed = time.monotonic() - started
        stats = mount.stats()
        mount.cut(tmp_path / "image")
    logs = writers.logs()
    assert len(all_acks(logs)) == WORKERS * OPS and all(log.in_flight is None for log in logs)
    # Every fsync paid its delay, one at a time: the run took at least that long, and was bounded.
    assert (stats["syncs"] - before["syncs"]) * SYNC_DELAY <= elapsed < 100
    fresh = check_durable_image(str(tmp_path / "image" / "t"), logs)
    assert fresh.version == WORKERS * OPS + 1
