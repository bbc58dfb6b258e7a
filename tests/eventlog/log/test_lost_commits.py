"""A commit cut off the log: readers never launder it, writers never paper over it, an
operator accepts the loss explicitly, and verify never forgets it (issue: tamper evidence
that a reader could erase)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import CommitLostError, CorruptLogError, InvalidInputError, Table
from eventlog.log.audit import anchor, digest
from lockstore import EmbeddedSlotStore, SlotClaim
from tests.conftest import SCHEMA, rows, sorted_ids

DAY = 86400.0


def _run(code: str, *args: str, clock_ahead: float = 0.0) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in its own Python process; ``clock_ahead``: that process's ``time.time``
    runs this many seconds ahead (past every grace period the engine has)."""
    prelude = ""
    if clock_ahead:
        prelude = (
            "import time as _t\n_real = _t.time\n"
            f"_t.time = lambda: _real() + {clock_ahead}\n"
            f"_t.time_ns = lambda: int((_real() + {clock_ahead}) * 1e9)\n"
        )
    script = prelude + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120, check=False
    )


def _cli(*args: str, clock_ahead: float = 0.0) -> subprocess.CompletedProcess[str]:
    return _run(
        "import sys\nfrom eventlog.cli import main\nsys.exit(main(sys.argv[1:]))",
        *args,
        clock_ahead=clock_ahead,
    )


def _verify_json(uri: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    proc = _cli("verify", uri, "--json", *extra, clock_ahead=DAY)
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def _commit(uri: str, version: int) -> Path:
    return Path(uri) / "_delta_log" / f"{version:020d}.json"


def _read_ids_in_a_process(uri: str) -> subprocess.CompletedProcess[str]:
    return _run(
        """
        import json, sys
        from eventlog import CommitLostError, Table
        try:
            t = Table.open(sys.argv[1])
        except CommitLostError as e:
            print(json.dumps({"error": type(e).__name__, "uri": e.uri, "version": e.version,
                              "txn_id": e.txn_id, "anchored_digest": e.anchored_digest}))
        else:
            print(json.dumps({"version": t.version, "ids": sorted(t.to_arrow().column("id").to_pylist())}))
        """,
        uri,
        clock_ahead=DAY,
    )


def test_a_cut_off_acknowledged_commit_is_never_laundered_by_a_reader(tmp_path: Path) -> None:
    """The issue's steps, each in its own process, the readers' clocks a day ahead."""
    uri = str(tmp_path / "t")
    writer = _run(
        """
        import json, sys
        import pyarrow as pa
        from eventlog import Table
        t = Table.create(sys.argv[1], pa.schema([("id", pa.int64())]))
        t.append(pa.table({"id": [1, 2, 3]}))
        result = t.delete("id = 2")
        print(json.dumps({"version": result.version, "txn_id": result.txn_id}))
        """,
        uri,
    )
    assert writer.returncode == 0, writer.stderr
    acknowledged = json.loads(writer.stdout)
    assert acknowledged["version"] == 2
    delete_bytes = _commit(uri, 2).read_bytes()
    _commit(uri, 2).unlink()  # an edit by hand, a lifecycle rule, a lost object

    code, report, _ = _verify_json(uri)
    assert (code, report["ok"], report["problem"], report["first_bad_version"]) == (1, False, "truncated", 2)

    # Any reader, long after every grace period: a typed error naming the loss; nothing written.
    before = sorted(os.listdir(Path(uri) / "_delta_log"))
    seen = json.loads(_read_ids_in_a_process(uri).stdout)
    assert seen == {
        "error": "CommitLostError",
        "uri": Table.handle(uri).uri,
        "version": 2,
        "txn_id": acknowledged["txn_id"],
        "anchored_digest": anchor(delete_bytes),
    }
    assert sorted(os.listdir(Path(uri) / "_delta_log")) == before and not _commit(uri, 2).exists()
    slots = Table.handle(uri).slots
    assert slots.get(Table.handle(uri).key, 2).complete  # type: ignore[union-attr]
    # A writer does not paper over it either.
    appended = _run(
        "import sys, pyarrow as pa\nfrom eventlog import Table\n"
        "Table.handle(sys.argv[1]).append(pa.table({'id': pa.array([9], pa.int64())}))",
        uri,
        clock_ahead=DAY,
    )
    assert appended.returncode != 0 and "CommitLostError" in appended.stderr
    # slots repair reports it and leaves it alone.
    repair = _cli("slots", "repair", uri, "--json", clock_ahead=DAY)
    actions = json.loads(repair.stdout)["actions"]
    assert [(a["version"], a["txn_id"]) for a in actions] == [(2, acknowledged["txn_id"])]
    assert actions[0]["action"].startswith("lost: acknowledged commit missing")
    assert not _commit(uri, 2).exists()
    code, report, _ = _verify_json(uri)  # every later run still fails
    assert (code, report["problem"], report["first_bad_version"]) == (1, "truncated", 2)

    # The operator accepts the loss explicitly.
    accepted = _cli("slots", "repair", uri, "--accept-lost", "2", "--json", clock_ahead=DAY)
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads(accepted.stdout)["actions"] == [
        {"version": 2, "txn_id": acknowledged["txn_id"], "action": "accept-lost"}
    ]
    t = Table.open(uri)
    repair_commit = t.history(1)[0]
    assert repair_commit["version"] == 2 and repair_commit["operation"] == "REPAIR"
    params = repair_commit["operationParameters"]
    assert params["lostTxnId"] == acknowledged["txn_id"] and params["acceptedLoss"] == "true"
    assert params["lostDigest"] == anchor(delete_bytes)
    assert sorted_ids(t) == [1, 2, 3]  # the DELETE is lost: the log says so, in version 2

    # From then on verify reports the loss, on every run, unless the auditor accepts it too.
    for _ in range(2):
        code, report, _ = _verify_json(uri)
        assert (code, report["ok"], report["problem"], report["first_bad_version"]) == (1, False, "lost", 2)
        assert acknowledged["txn_id"] in report["detail"]
    code, report, _ = _verify_json(uri, "--accept-lost", "2")
    assert (code, report["ok"]) == (0, True)
    assert any("acknowledged commit of version 2" in n and "accepted" in n for n in report["notes"])
    assert t.append(pa.table({"id": pa.array([4], pa.int64())})).version == 3  # the table moves on
    assert _verify_json(uri, "--accept-lost", "2")[0] == 0 and _verify_json(uri)[1]["problem"] == "lost"


def _table_with_five_versions(tmp_path: Path) -> Table:
    t = Table.create(str(tmp_path / "t"), SCHEMA)
    for i in range(1, 5):
        t.append(rows([i]))
    return t


def test_a_commit_removed_from_the_middle_is_lost_and_its_acceptance_keeps_the_chain(tmp_path: Path) -> None:
    t = _table_with_five_versions(tmp_path)
    removed = _commit(t.uri, 2).read_bytes()
    txn = Table.handle(t.uri).slots.get(t.key, 2).claim.txn_id  # type: ignore[union-attr]
    _commit(t.uri, 2).unlink()
    with pytest.raises(CommitLostError) as info:
        Table.open(t.uri)
    assert (info.value.version, info.value.txn_id, info.value.anchored_digest) == (2, txn, anchor(removed))
    assert isinstance(info.value, CorruptLogError)  # the family callers already catch
    report = Table.handle(t.uri).verify()
    assert (report.ok, report.problem, report.first_bad_version) == (False, "removed", 2)
    assert Table.handle(t.uri).repair_slots(dry_run=True, accept_lost=[2]) == [
        {"version": 2, "txn_id": txn, "action": "accept-lost"}
    ]
    assert not _commit(t.uri, 2).exists()  # a dry run writes nothing
    Table.handle(t.uri).repair_slots(accept_lost=[2])
    params = Table.open(t.uri).history(3)[2]["operationParameters"]
    assert params["lostFileDigest"] == digest(removed)  # what version 3 chained to
    report = Table.handle(t.uri).verify()
    assert (report.ok, report.problem, report.first_bad_version) == (False, "lost", 2)
    report = Table.handle(t.uri).verify(accept_lost=[2])
    assert report.ok and report.versions_checked == 5  # versions 3 and 4 still link
    assert sorted_ids(Table.open(t.uri)) == [1, 3, 4]


def test_accept_lost_refuses_what_was_not_lost(tmp_path: Path) -> None:
    t = _table_with_five_versions(tmp_path)
    with pytest.raises(InvalidInputError, match="is in the log"):
        t.repair_slots(accept_lost=[3])
    with pytest.raises(InvalidInputError, match="never granted"):
        t.repair_slots(accept_lost=[9])
    slots = EmbeddedSlotStore(Path(t.uri) / "_eventlog" / "slots")
    assert slots.claim(t.key, 5, SlotClaim("never-done", "never-done.json"))
    with pytest.raises(InvalidInputError, match="never acknowledged"):
        t.repair_slots(accept_lost=[5])
    assert not _commit(t.uri, 5).exists() and Table.open(t.uri).version == 4


def test_a_staged_file_changed_after_its_claim_is_not_published(tmp_path: Path) -> None:
    t = _table_with_five_versions(tmp_path)
    staged = Path(t.log.staged_dir) / "changed.json"
    staged.parent.mkdir(parents=True, exist_ok=True)
    staged.write_bytes(_commit(t.uri, 4).read_bytes())
    slots = EmbeddedSlotStore(Path(t.uri) / "_eventlog" / "slots")
    assert slots.claim(t.key, 5, SlotClaim("changed", "changed.json", digest="00" * 32))
    with pytest.raises(CorruptLogError, match="does not hash to the digest") as info:
        Table.open(t.uri)
    assert info.value.version == 5 and not isinstance(info.value, CommitLostError)
    assert not _commit(t.uri, 5).exists()


def test_a_never_completed_claim_stays_unresolved_for_readers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import eventlog.log.recovery as recovery

    monkeypatch.setattr(recovery, "REPAIR_GRACE_SECONDS", 0.0)  # its writer is provably gone
    t = _table_with_five_versions(tmp_path)
    slots = EmbeddedSlotStore(Path(t.uri) / "_eventlog" / "slots")
    assert slots.claim(t.key, 5, SlotClaim("died", "died.json", digest="cd" * 32))
    listing = sorted(os.listdir(Path(t.uri) / "_delta_log"))
    for _ in range(2):
        reader = Table.open(t.uri)
        assert reader.version == 4 and sorted_ids(reader) == [1, 2, 3, 4]
    assert sorted(os.listdir(Path(t.uri) / "_delta_log")) == listing
    assert not slots.get(t.key, 5).complete  # type: ignore[union-attr]
    report = Table.handle(t.uri).verify()
    assert report.ok and any(
        "version 5 was claimed by txn died but never completed" in n for n in report.notes
    )
    assert Table.open(t.uri).append(rows([6])).version == 6  # a writer resolves it, then commits
    assert Table.open(t.uri).history(2)[1]["operationParameters"]["lostDigest"] == "cd" * 32
