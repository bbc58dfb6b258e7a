"""Power loss on a local table (issue 28): writers on a file system that forgets every
write not yet fsynced (tests/support/powerloss.py), the power cut at a random moment.

Durable mode (``durable=True``): no acknowledged commit is ever lost. Default mode: every
commit acknowledged since the kernel last wrote its page cache back is lost; a reader
then sees the table as it was at that writeback (an older version, consistent and
verifiable), and the next writer takes the lost versions' numbers again.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog import Table, TableNotFoundError
from tests.support.invariants import SCHEMA, check_invariants
from tests.support.powerloss import PowerLossMount
from tests.support.powerloss_writers import Writers, all_acks, check_durable_image, finish

pytestmark = pytest.mark.timeout(120)

WORKERS = 3


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[PowerLossMount]:
    with PowerLossMount(tmp_path / "mnt") as m:
        yield m


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_durable_mode_loses_no_acknowledged_commit(seed: int, mount: PowerLossMount, tmp_path: Path) -> None:
    rng = random.Random(seed)
    uri = str(mount.mountpoint / "t")
    Table.create(uri, schema=SCHEMA, durable=True).close()
    writers = Writers(uri, WORKERS, tmp_path / "logs", durable=True, seed=seed)
    try:
        writers.wait_acks(rng.randrange(4, 13), timeout=60)
        time.sleep(rng.uniform(0, 0.3))  # the cut lands anywhere in a commit
        cut = mount.cut(tmp_path / "image")
    finally:
        writers.kill()
    mount.close()
    logs = writers.logs()
    assert cut["syncs"] > 0 and len(all_acks(logs)) >= 4
    fresh = check_durable_image(str(tmp_path / "image" / "t"), logs)
    assert fresh.version >= max(ack["version"] for ack in all_acks(logs)) + 1


def test_default_mode_loses_what_came_after_the_last_writeback(mount: PowerLossMount, tmp_path: Path) -> None:
    uri = str(mount.mountpoint / "t")
    Table.create(uri, schema=SCHEMA).close()
    writers = Writers(uri, WORKERS, tmp_path / "logs", durable=False, seed=7)
    try:
        writers.wait_acks(4, timeout=60)
        before = all_acks(writers.logs())  # acknowledged before the writeback
        mount.writeback()  # the kernel flushes its dirty pages and directories
        # Kept: those, and at most one commit per writer published but not yet acknowledged
        # at the writeback; so 6 more than that are acknowledged commits that are lost.
        writers.wait_acks(len(before) + WORKERS + 6, timeout=60)
        mount.cut(tmp_path / "image")
    finally:
        writers.kill()
    mount.close()
    acks = all_acks(writers.logs())
    image = str(tmp_path / "image" / "t")
    table = Table.open(image)
    # The reader sees an older version: the log as it was at the writeback, whole.
    latest_acked = max(ack["version"] for ack in acks)
    assert max(ack["version"] for ack in before) <= table.version < latest_acked
    kept = [ack for ack in acks if ack["version"] <= table.version]
    lost = [ack for ack in acks if ack["version"] > table.version]
    assert {a["txn"] for a in before} <= {a["txn"] for a in kept}
    assert len(lost) >= 6  # acknowledged, then gone without a trace: no error tells
    check_invariants(image, kept)  # consistent: exactly the commits acknowledged up to it
    # The next write takes a version that was acknowledged to another commit before.
    fresh = finish(image)
    assert fresh.version in {ack["version"] for ack in lost}


def test_default_mode_without_a_writeback_keeps_no_table(mount: PowerLossMount, tmp_path: Path) -> None:
    uri = str(mount.mountpoint / "t")
    Table.create(uri, schema=SCHEMA).close()
    writers = Writers(uri, 1, tmp_path / "logs", durable=False, seed=11)
    try:
        writers.wait_acks(2, timeout=60)
        mount.cut(tmp_path / "image")
    finally:
        writers.kill()
    mount.close()
    assert not Table.exists(str(tmp_path / "image" / "t"))
    with pytest.raises(TableNotFoundError):
        Table.open(str(tmp_path / "image" / "t"))
