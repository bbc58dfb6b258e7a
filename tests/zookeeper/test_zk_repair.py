"""Operations on version slots: the status view and the safe repair command."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from eventlog import CorruptLogError, Table
from eventlog import cli as eventlog_cli
from lockstore import SlotClaim
from lockstore import cli as lockstore_cli
from lockstore.zookeeper import ZooKeeperSlotStore
from tests.support.invariants import SCHEMA

pytestmark = pytest.mark.zookeeper


def test_repair_only_touches_slots_of_provably_dead_writers(
    tmp_path: Path, zk_hosts: str, capsys: pytest.CaptureFixture[str]
) -> None:
    chroot = f"/t-{uuid.uuid4().hex[:12]}"
    spec = f"zk://{zk_hosts}{chroot}?timeout=10"
    uri = str(tmp_path / "t")
    t = Table.create(uri, SCHEMA, slots=spec)
    writer = ZooKeeperSlotStore(zk_hosts, chroot=chroot, timeout=10)
    assert writer.latest(t.key) == 0
    assert writer.claim(t.key, 1, SlotClaim("vanished-txn", "vanished-txn.json", {"host": "h", "pid": "1"}))

    # While the claiming writer's session lives, readers see version 0, writers refuse to
    # guess, and repair skips the slot.
    assert Table.open(uri, slots=spec).version == 0
    with pytest.raises(CorruptLogError):
        Table.open(uri, slots=spec).append(t.to_arrow())
    assert lockstore_cli.main(["status", "--slots", spec, "--table", t.key]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["latest"] == 1
    assert [(s["version"], s["txn_id"], s["owner_alive"]) for s in status["incomplete"]] == [
        (1, "vanished-txn", True)
    ]
    assert len(status["sessions"]) >= 2  # the table's handle and the claiming writer
    assert t.repair_slots() == [
        {"version": 1, "txn_id": "vanished-txn", "action": "skip: writer may be alive"}
    ]

    writer.close()  # the writer dies: its session (and ephemeral node) go away
    deadline = time.monotonic() + 10
    while t.slots.owner_alive(t.key, 1) is not False and time.monotonic() < deadline:
        time.sleep(0.05)
    assert eventlog_cli.main(["slots", "repair", uri, "--slots", spec, "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["actions"][0]["action"] == "repair-commit"
    assert t.log.list_log().count("00000000000000000001.json") == 0  # the dry run wrote nothing
    assert eventlog_cli.main(["slots", "repair", uri, "--slots", spec, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["actions"][0]["action"] == "repair-commit"
    reopened = Table.open(uri, slots=spec)
    repair = reopened.history(1)[0]
    assert repair["version"] == 1 and repair["operation"] == "REPAIR"
    assert repair["operationParameters"]["lostTxnId"] == "vanished-txn"
    assert reopened.slots.get(reopened.key, 1).complete  # type: ignore[union-attr]
    assert reopened.append(t.to_arrow()).version == 2  # the table moved on
