"""The ``eventlog`` command line: every subcommand's output (tables and ``--json`` parsed
back against the table) and exit code, on good and bad input."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table
from eventlog.cli import main
from eventlog.cli.audits import VERIFY_KEYS
from eventlog.cli.reads import HISTORY_KEYS
from lockstore import SlotClaim
from tests.conftest import SCHEMA, rows

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _plain_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """No colours, no forced terminal, the default width, no slot store or key from outside."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "COLUMNS", "EVENTLOG_SLOTS", "EVENTLOG_AUDIT_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def uri(tmp_path: Path) -> str:
    """A table with four versions: create, two appends, a delete (rows 1, 3, 4, 5 live)."""
    t = Table.create(str(tmp_path / "t"), SCHEMA, partition_by=["date"])
    t.append(rows([1, 2, 3]))  # 1
    t.append(rows([4, 5], "2024-01-02"), user_metadata="second batch")  # 2
    t.delete("id = 2")  # 3
    t.close()
    return t.uri


class Run:
    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    def __call__(self, *args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *args: str) -> Any:
        code, out, err = self("--json", *args)
        assert code == 0, err
        return json.loads(out)

    def fails(self, code: int, *args: str) -> str:
        """Run, expect ``code``, one line on stderr and no traceback; return that line."""
        got, out, err = self(*args)
        assert got == code, (got, out, err)
        assert out == ""
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("eventlog: "), err
        return lines[0]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    return Run(capsys)


def _ids(table_rows: list[dict[str, Any]]) -> list[int]:
    return sorted(r["id"] for r in table_rows)


def _commit(uri: str, version: int) -> Path:
    return Path(uri) / "_delta_log" / f"{version:020d}.json"


# --------------------------------------------------------------------------- history


def test_history_table_and_json(uri: str, run: Run) -> None:
    code, out, err = run("history", uri)
    assert code == 0 and err == ""
    assert "History of" in out and "DELETE" in out and "CREATE TABLE" in out and "second batch" in out
    data = run.json("history", uri)
    assert data["table"] == uri
    entries = data["history"]
    assert [e["version"] for e in entries] == [3, 2, 1, 0]
    assert [e["operation"] for e in entries] == ["DELETE", "WRITE", "WRITE", "CREATE TABLE"]
    assert all(tuple(e) == HISTORY_KEYS for e in entries)
    t = Table.open(uri)
    expected = {h["version"]: h for h in t.history()}
    for e in entries:
        info = expected[e["version"]]
        assert (e["timestamp"], e["txnId"], e["readVersion"]) == (
            info["timestamp"],
            info["txnId"],
            info.get("readVersion"),
        )
        assert e["operationParameters"] == info["operationParameters"]
    assert entries[1]["userMetadata"] == "second batch" and entries[1]["isBlindAppend"] is True
    assert entries[0]["operationMetrics"]["numDeletedRows"] == "1"
    assert entries[0]["userId"] is None


def test_history_limit_and_options_on_either_side(uri: str, run: Run) -> None:
    assert [e["version"] for e in run.json("history", uri, "--limit", "2")["history"]] == [3, 2]
    code, out, _ = run("history", uri, "--limit", "1", "--json")  # --json after the subcommand
    assert code == 0 and [e["version"] for e in json.loads(out)["history"]] == [3]
    assert len(run.json("history", uri, "--limit", "0")["history"]) == 4  # 0: all
    assert "'--limit'" in run.fails(2, "history", uri, "--limit", "-1")


# --------------------------------------------------------------------------- show


def test_show_rows_match_the_table(uri: str, run: Run) -> None:
    t = Table.open(uri)
    data = run.json("show", uri)
    assert (data["table"], data["version"]) == (uri, 3)
    assert data["columns"] == ["id", "date", "x", "y"]
    by_id = sorted(t.to_arrow().to_pylist(), key=lambda r: r["id"])
    assert sorted(data["rows"], key=lambda r: r["id"]) == by_id
    assert (data["num_rows"], data["matched_rows"], data["truncated"]) == (4, 4, False)
    code, out, _ = run("show", uri)
    assert code == 0 and "at version 3" in out and "2024-01-02" in out


def test_show_where_columns_limit_and_time_travel(uri: str, run: Run) -> None:
    assert _ids(run.json("show", uri, "--where", "id > 3")["rows"]) == [4, 5]
    data = run.json("show", uri, "--columns", "id, x", "--where", "date = '2024-01-01'")
    assert data["columns"] == ["id", "x"] and _ids(data["rows"]) == [1, 3]
    data = run.json("show", uri, "--limit", "1")
    assert (data["num_rows"], data["matched_rows"], data["truncated"]) == (1, 4, True)
    assert _ids(run.json("show", uri, "--as-of", "1")["rows"]) == [1, 2, 3]
    t = Table.open(uri)
    stamp = t.history()[2]["timestamp"]  # version 1's commit time
    when = dt.datetime.fromtimestamp(stamp / 1000, dt.UTC).isoformat()
    data = run.json("show", uri, "--as-of", when)
    assert data["version"] == t.version_at(when) and _ids(data["rows"]) == _ids(
        t.to_arrow(version=data["version"]).to_pylist()
    )


def test_show_bad_input(uri: str, run: Run) -> None:
    assert "PredicateError" in run.fails(2, "show", uri, "--where", "id = = 3")
    assert "UnknownColumnError" in run.fails(2, "show", uri, "--columns", "nope")
    assert "VersionNotFoundError" in run.fails(2, "show", uri, "--as-of", "99")
    assert "cannot parse timestamp" in run.fails(2, "show", uri, "--as-of", "yesterday")
    assert "no column names" in run.fails(2, "show", uri, "--columns", ",")


def test_show_row_ids(tmp_path: Path, run: Run) -> None:
    uri = str(tmp_path / "tracked")
    t = Table.create(uri, SCHEMA, properties={"delta.enableRowTracking": "true"})
    t.append(rows([1, 2, 3]))
    t.update("id = 2", {"x": "20"})
    data = run.json("show", uri, "--row-ids", "--columns", "id")
    assert data["columns"] == ["id", "_row_id", "_row_commit_version"]
    got = sorted((r["id"], r["_row_id"], r["_row_commit_version"]) for r in data["rows"])
    assert got == [(1, 0, 1), (2, 1, 2), (3, 2, 1)]
    Table.create(str(tmp_path / "plain"), SCHEMA).close()
    assert "RowTrackingNotEnabledError" in run.fails(2, "show", str(tmp_path / "plain"), "--row-ids")


def test_show_json_holds_every_value_type(tmp_path: Path, run: Run) -> None:
    data = pa.table(
        {
            "ts": pa.array([dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.UTC)], pa.timestamp("us", "UTC")),
            "day": pa.array([dt.date(2024, 5, 1)], pa.date32()),
            "amount": pa.array([decimal.Decimal("12.34")], pa.decimal128(10, 2)),
            "blob": pa.array([b"\x00\xff"], pa.binary()),
            "ratio": pa.array([math.nan], pa.float64()),
            "tags": pa.array([["a", "[b]"]], pa.list_(pa.string())),
        }
    )
    t = Table.create(str(tmp_path / "types"), data=data)
    (row,) = run.json("show", t.uri)["rows"]
    assert row == {
        "ts": "2024-05-01T12:30:00+00:00",
        "day": "2024-05-01",
        "amount": "12.34",
        "blob": "AP8=",
        "ratio": "NaN",
        "tags": ["a", "[b]"],
    }
    code, out, _ = run("show", t.uri)
    assert code == 0 and "[b]" in out and "12.34" in out  # no rich markup read from values


# --------------------------------------------------------------------------- describe


def test_describe(uri: str, run: Run) -> None:
    t = Table.open(uri)
    data = run.json("describe", uri)
    snap = t.snapshot()
    assert (data["table"], data["id"], data["version"]) == (uri, snap.table_id, 3)
    assert data["earliest_version"] == 0
    assert [f["name"] for f in data["schema"]["fields"]] == ["id", "date", "x", "y"]
    assert data["schema"]["fields"][0]["type"] == "long"
    assert data["partition_columns"] == ["date"] and data["properties"] == {}
    protocol = snap.protocol.to_json()
    assert data["protocol"] == {"readerFeatures": None, "writerFeatures": None, **protocol}
    assert data["num_files"] == len(t.files()) and data["num_rows"] == 4
    assert data["size_bytes"] == sum(a.size for a in snap.add_files)
    assert data["latest_checkpoint"] is None
    t.checkpoint()
    assert run.json("describe", uri)["latest_checkpoint"] == 3
    code, out, _ = run("describe", uri)
    assert code == 0 and "Schema" in out and "latest checkpoint" in out and "long" in out


# --------------------------------------------------------------------------- diff


def test_diff_files_and_rows(uri: str, run: Run) -> None:
    t = Table.open(uri)
    expected = t.diff(1, 3)
    data = run.json("diff", uri, "1", "3")
    assert (data["from_version"], data["to_version"]) == (1, 3)
    assert data["files_added"] == list(expected.files_added)
    assert data["files_removed"] == list(expected.files_removed)
    assert (data["rows_added"], data["rows_removed"]) == (expected.rows_added, expected.rows_removed)
    assert data["added"] is None and data["removed"] is None
    data = run.json("diff", uri, "1", "3", "--rows")
    assert _ids(data["added"]) == [4, 5] and _ids(data["removed"]) == [2]
    assert data["columns"] == ["id", "date", "x", "y"]
    assert run.json("diff", uri, "2")["to_version"] == 3  # B defaults to the latest
    code, out, _ = run("diff", uri, "1", "3", "--rows")
    assert code == 0 and "Rows removed" in out and "Rows added" in out and "files added" in out
    assert "VersionNotFoundError" in run.fails(2, "diff", uri, "0", "9")
    assert "Missing argument" in run.fails(2, "diff", uri)


# --------------------------------------------------------------------------- replay


def test_replay_from_version_0(uri: str, run: Run) -> None:
    data = run.json("replay", uri)
    assert (data["start_version"], data["from_checkpoint"], data["to_version"]) == (0, None, 3)
    changes = data["versions"]
    assert [c["version"] for c in changes] == [0, 1, 2, 3]
    assert [c["operation"] for c in changes] == ["CREATE TABLE", "WRITE", "WRITE", "DELETE"]
    assert (changes[1]["rows_added"], len(changes[1]["files_added"])) == (3, 1)
    assert (changes[3]["rows_removed"], changes[3]["rows_added"]) == (3, 2)  # file 1-3 rewritten
    assert changes[2]["user_metadata"] == "second batch" and changes[2]["read_version"] == 1
    assert run.json("replay", uri, "--to", "1")["to_version"] == 1
    code, out, _ = run("replay", uri)
    assert code == 0 and "from version 0" in out and "DELETE" in out
    assert "VersionNotFoundError" in run.fails(2, "replay", uri, "--to", "9")


def test_replay_from_a_checkpoint_says_so(uri: str, run: Run) -> None:
    Table.open(uri).checkpoint()  # at version 3
    t = Table.open(uri)
    t.append(rows([6]))  # 4
    for v in range(3):
        _commit(uri, v).unlink()  # log cleanup
    _commit(uri, 3).unlink()
    data = run.json("replay", uri)
    assert (data["start_version"], data["from_checkpoint"]) == (4, 3)
    assert [c["version"] for c in data["versions"]] == [4]
    code, out, _ = run("replay", uri)
    assert code == 0 and "from checkpoint 3" in out


# --------------------------------------------------------------------------- verify


def test_verify_intact_and_edited(uri: str, run: Run) -> None:
    data = run.json("verify", uri)
    assert set(data) == {"table", *VERIFY_KEYS}
    assert data["ok"] is True and data["first_bad_version"] is None and data["problem"] is None
    assert data["versions_checked"] == 4 and data["hmac_checked"] is False
    code, out, err = run("verify", uri)
    assert code == 0 and "OK" in out and err == ""

    path = _commit(uri, 1)
    path.write_bytes(path.read_bytes().replace(b'"WRITE"', b'"MERGE"', 1))
    code, out, err = run("--json", "verify", uri)
    data = json.loads(out)
    assert code == 1 and (data["ok"], data["first_bad_version"], data["problem"]) == (False, 1, "edited")
    assert err.splitlines() == [err.strip()] and err.startswith("eventlog: verify failed: version 1 edited")
    code, out, _ = run("verify", uri)
    assert code == 1 and "FAILED" in out and "edited" in out


def test_verify_with_an_audit_key(tmp_path: Path, run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    t = Table.create(str(tmp_path / "k"), SCHEMA, audit_key=b"secret")
    t.append(rows([1]))
    monkeypatch.setenv("MY_AUDIT_KEY", "secret")
    data = run.json("verify", t.uri, "--key-env", "MY_AUDIT_KEY")
    assert data["ok"] is True and data["hmac_checked"] is True
    monkeypatch.setenv("MY_AUDIT_KEY", "wrong")
    code, out, _ = run("--json", "verify", t.uri, "--key-env", "MY_AUDIT_KEY")
    assert code == 1 and json.loads(out)["ok"] is False
    assert "MISSING_KEY is not set" in run.fails(2, "verify", t.uri, "--key-env", "MISSING_KEY")


def test_verify_names_a_removed_commit(uri: str, run: Run) -> None:
    _commit(uri, 2).unlink()  # opening the table would fail on the gap; verify must not
    code, out, _ = run("--json", "verify", uri)
    data = json.loads(out)
    assert code == 1 and (data["first_bad_version"], data["problem"]) == (2, "removed")


# --------------------------------------------------------------------------- vacuum, optimize, restore


def test_vacuum(tmp_path: Path, run: Run) -> None:
    props = {"delta.deletedFileRetentionDuration": "interval 0 hours"}
    t = Table.create(str(tmp_path / "v"), SCHEMA, properties=props)
    t.append(rows([1, 2]))
    old = t.files()
    t.delete("id = 1")  # rewrites the file: the old one is retired
    data = run.json("vacuum", t.uri, "--dry-run", "--retention-hours", "0")
    gone = [str(Path(t.uri) / old[0])]  # vacuum names the files by their full paths
    assert (data["dry_run"], data["retention_hours"], data["files"], data["num_files"]) == (True, 0, gone, 1)
    assert (Path(t.uri) / old[0]).exists()
    code, out, _ = run("vacuum", t.uri, "--retention-hours", "0")
    assert code == 0 and "deleted 1 files" in out
    assert not (Path(t.uri) / old[0]).exists()
    assert _ids(t.to_arrow().to_pylist()) == [2]
    assert run.json("vacuum", t.uri)["files"] == []


def test_vacuum_refuses_a_short_retention(uri: str, run: Run) -> None:
    assert "retention" in run.fails(2, "vacuum", uri, "--retention-hours", "1")
    assert "No such option" in run.fails(2, "vacuum", uri, "--retention", "1")


def test_optimize(tmp_path: Path, run: Run) -> None:
    t = Table.create(str(tmp_path / "o"), SCHEMA, partition_by=["date"])
    for i in range(3):
        t.append(rows([i]))
    t.append(rows([9], "2024-01-02"))
    data = run.json("optimize", t.uri, "--where", "date = '2024-01-01'", "--zorder-by", "id,x")
    assert (data["version"], data["operation"], data["zorder_by"]) == (5, "OPTIMIZE", ["id", "x"])
    assert data["metrics"]["numRemovedFiles"] == "3" and data["metrics"]["numAddedFiles"] == "1"
    assert data["where"] == "date = '2024-01-01'"
    assert len(t.files()) == 2 and _ids(t.to_arrow().to_pylist()) == [0, 1, 2, 9]
    code, out, _ = run("optimize", t.uri)
    assert code == 0 and "OPTIMIZE" in out
    assert "PredicateError" in run.fails(2, "optimize", t.uri, "--where", "date = = 1")
    assert "UnknownColumnError" in run.fails(2, "optimize", t.uri, "--zorder-by", "nope")


def test_restore(uri: str, run: Run) -> None:
    data = run.json("restore", uri, "1")
    assert (data["version"], data["restored_version"], data["operation"]) == (4, 1, "RESTORE")
    t = Table.open(uri)
    assert _ids(t.to_arrow().to_pylist()) == [1, 2, 3]
    code, out, _ = run("restore", uri, "2")
    assert code == 0 and "RESTORE" in out and "restored version" in out
    assert "VersionNotFoundError" in run.fails(2, "restore", uri, "99")
    assert "Missing argument" in run.fails(2, "restore", uri)


# --------------------------------------------------------------------------- slots


def test_slots_status_and_repair_see_slots_before_the_log_finishes_them(uri: str, run: Run) -> None:
    t = Table.handle(uri)
    assert t.slots.claim(t.key, 4, SlotClaim("lost-txn", "lost-txn.json"))
    # A read sees what was published (version 3) and leaves the slot as it is.
    assert run.json("history", uri)["history"][0]["version"] == 3
    data = run.json("slots", "status", uri)
    assert data["table"] == t.key and data["latest"] == 4
    assert [(s["version"], s["txn_id"], s["staged"]) for s in data["incomplete"]] == [
        (4, "lost-txn", "lost-txn.json")
    ]
    code, out, _ = run("slots", "status", uri)
    assert code == 0 and "lost-txn" in out and "Incomplete slots" in out
    data = run.json("slots", "repair", uri, "--dry-run", "--limit", "10")
    assert data == {
        "table": t.key,
        "dry_run": True,
        "actions": [{"version": 4, "txn_id": "lost-txn", "action": "skip: writer may be alive"}],
    }
    assert not _commit(uri, 4).exists()
    code, out, _ = run("slots", "repair", uri)
    assert code == 0 and "skip: writer may be alive" in out


def test_slots_on_a_healthy_table(uri: str, run: Run) -> None:
    data = run.json("slots", "status", uri)
    assert (data["latest"], data["incomplete"]) == (3, [])
    assert run.json("slots", "repair", uri)["actions"] == []
    code, out, _ = run("slots", "status", uri)
    assert code == 0 and "Incomplete slots: none" in out
    assert "No such command" in run.fails(2, "slots", uri)
    assert "'--limit'" in run.fails(2, "slots", "status", uri, "--limit", "0")


# --------------------------------------------------------------------------- bad input, every subcommand


def _commands(table: str) -> list[list[str]]:
    return [
        ["history", table],
        ["show", table],
        ["describe", table],
        ["diff", table, "0", "1"],
        ["replay", table],
        ["verify", table],
        ["vacuum", table],
        ["optimize", table],
        ["restore", table, "0"],
        ["slots", "status", table],
        ["slots", "repair", table],
    ]


_NAMES = ["-".join(w for w in c if w != "T") for c in _commands("T")]


@pytest.mark.parametrize("index", range(11), ids=_NAMES)
def test_a_missing_table_is_bad_input(tmp_path: Path, run: Run, index: int) -> None:
    missing = tmp_path / "no" / "table"
    args = _commands(str(missing))[index]
    assert "TableNotFoundError: no table at" in run.fails(2, *args)
    assert "TableNotFoundError" in run.fails(2, "--json", *args)
    assert not missing.exists()  # looking created nothing


@pytest.mark.parametrize("index", range(11), ids=_NAMES)
def test_an_unknown_option_is_bad_input(uri: str, run: Run, index: int) -> None:
    args = _commands(uri)[index]
    line = run.fails(2, *args, "--no-such-option")
    assert "No such option" in line and "--no-such-option" in line and "--help" in line


@pytest.mark.parametrize("index", [0, 1, 2, 3, 4, 6, 7, 8], ids=lambda i: _NAMES[i])
def test_a_corrupt_commit_fails_with_one_line(uri: str, run: Run, index: int) -> None:
    _commit(uri, 2).write_bytes(b'{"commitInfo": {"timestamp": 1, "operation": "WRITE"}}\n{not json\n')
    line = run.fails(1, *_commands(uri)[index])
    assert "CorruptLogError" in line and "commit 2" in line


def test_verify_reports_a_corrupt_commit(uri: str, run: Run) -> None:
    _commit(uri, 2).write_bytes(b"{not json\n")
    code, out, err = run("--json", "verify", uri)
    assert code == 1 and json.loads(out)["first_bad_version"] == 2 and "verify failed" in err


def test_usage_errors(uri: str, run: Run) -> None:
    assert "Missing command" in run.fails(2)
    assert "No such command 'nope'" in run.fails(2, "nope", uri)
    assert "'bogus'" in run.fails(2, "--log-level", "bogus", "history", uri)
    code, out, _ = run("--help")
    assert code == 0 and "verify" in out and "Global options" in out
    code, out, _ = run("show", "--help")
    assert code == 0 and "--as-of" in out


def test_storage_options_are_parsed_and_reach_the_file_system(uri: str, run: Run) -> None:
    """Values reach fsspec (the S3 end is in tests/eventlog/test_s3.py); malformed pairs are
    usage errors (exit 2)."""
    assert len(run.json("--storage-option", "auto_mkdir=true", "history", uri)) >= 1
    code, _, err = run("slots", "status", uri, "--storage-option", "auto_mkdir=")
    assert code == 0, err
    assert "expected KEY=VALUE, got 'anon'" in run.fails(2, "history", uri, "--storage-option", "anon")


def test_debug_prints_the_traceback(tmp_path: Path, run: Run) -> None:
    code, out, err = run("--debug", "history", str(tmp_path / "none"))
    assert code == 2 and out == ""
    assert "Traceback (most recent call last)" in err
    assert err.splitlines()[-1].startswith("eventlog: TableNotFoundError: ")


def test_slot_store_spec_errors_are_bad_input(uri: str, run: Run) -> None:
    assert "UnknownSlotStoreError" in run.fails(2, "history", uri, "--slots", "nosuch://x")


def test_log_level_sends_engine_logs_to_stderr(uri: str, run: Run) -> None:
    Table.open(uri).checkpoint()
    Table.open(uri).append(rows([6]))
    for v in range(4):
        _commit(uri, v).unlink()
    code, _, err = run("replay", uri, "--log-level", "INFO")
    assert code == 0 and "starts from checkpoint 3" in err
    code, _, err = run("replay", uri)
    assert code == 0 and err == ""


# --------------------------------------------------------------------------- progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bars_only_on_a_terminal(uri: str, run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    for args in (["replay", uri], ["verify", uri], ["vacuum", uri, "--dry-run"]):
        code, out, err = run(*args)
        assert code == 0 and "\x1b[" not in out + err
        assert not any(word in out + err for word in ("Replaying", "Verifying", "Vacuuming"))
    screen = _Terminal()
    monkeypatch.setattr(sys, "stdout", screen)
    assert main(["replay", uri]) == 0
    assert "Replaying" in screen.getvalue() and "DELETE" in screen.getvalue()
    screen = _Terminal()
    monkeypatch.setattr(sys, "stdout", screen)
    assert main(["--json", "optimize", uri]) == 0
    text = screen.getvalue()
    assert "Optimizing" in text and json.loads(text[text.index("{") :])["operation"] == "OPTIMIZE"


# --------------------------------------------------------------------------- the program


def test_python_dash_m(tmp_path: Path) -> None:
    """The program as a process: exit code 2 and one line on stderr for a missing table."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "COLUMNS")}
    proc = subprocess.run(
        [sys.executable, "-m", "eventlog.cli", "describe", str(tmp_path / "none")],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("eventlog: TableNotFoundError: ")


def test_parse_only_runs_nothing(tmp_path: Path) -> None:
    target = tmp_path / "t"
    assert main(["slots", "repair", str(target), "--dry-run"], parse_only=True) == 0
    assert main(["vacuum", str(target), "--retention-hours", "1"], parse_only=True) == 0
    assert main(["slots", "repair", str(target), "--dryrun"], parse_only=True) == 2
    assert not target.exists()
