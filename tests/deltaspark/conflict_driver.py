"""Runs the conflict scenarios (tests/deltaspark/conflict_scenarios.py) on our engine and on Delta Spark.

Ours: two handles on a copy of the starting table; the second's transaction is opened and
its operation staged (reading version v), then the first's runs and commits, then the second
commits. The outcome is "commit" or the exception's class name.

Delta Spark: its transaction API over py4j, as its own conflict-checker tests do
(``DeltaLog.forTable(...).startTransaction()``, recorded reads, ``commit(actions, op)``).

* Reads: what Delta's own command records. ``filterFiles`` with the conjuncts of a DELETE or
  UPDATE condition, with the target-only conjuncts of a MERGE condition, with an OPTIMIZE's
  partition predicate (none when unpartitioned); ``txnVersion`` for an idempotent write; none
  for a blind append or a table property change. Delta computes the files read (partition
  pruning and data skipping on the table's statistics) itself.
* Actions: the same as ours. Each transaction's actions are made by our engine running the
  operation alone on another copy of the starting table: its commit file is read back and each
  line turned into a Delta action (``Action.fromJson``), and its new data and deletion-vector
  files are copied next to Delta's table. commitInfo is left out (Delta writes its own), and a
  metadata change goes through ``updateMetadata`` (``updateMetadataForNewTable`` for a create),
  as Delta's ALTER TABLE and CREATE TABLE do, so Delta derives the protocol upgrade itself.
* No adaptation: our DV ``add`` actions carry ``"tightBounds": false`` statistics, which Delta's
  DML operations require (DELTA_ADDING_DELETION_VECTORS_WITH_TIGHT_BOUNDS_DISALLOWED).
* Operations: the ``DeltaOperations`` of the command (Write in append mode, Delete, Update,
  Merge, Optimize with or without zOrderBy, SetTableProperties, CreateTable), which decide
  Delta's blind-append and snapshot-isolation (OPTIMIZE) handling with the actions.
* Speed: scenarios that share the starting table and the first transaction run on one Delta
  table (:meth:`DeltaPeer.run_group`), so Delta computes that table's state once: every
  transaction starts at v, the first commits, then each second commits in turn, and a second
  that committed is taken back (its commit file deleted) before the next one commits, so each
  meets exactly the one winning commit of its scenario. test_conflicts.py checks a few of them
  against a table of their own.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from eventlog import DeltaConcurrentModificationException, Table, Transaction
from eventlog.files.enforce import conform
from eventlog.files.schema import canonical_schema
from eventlog.ops.common import write_rows
from eventlog.snapshot.new_table import new_table_metadata
from eventlog.snapshot.protocol import protocol_for
from tests.conftest import SCHEMA, rows
from tests.deltaspark.conflict_scenarios import (
    APP_TXN,
    CREATE,
    D1,
    D2,
    DELETE,
    ENABLE_DVS,
    INSERT,
    MERGE,
    OPTIMIZE,
    SET_PROPS,
    UPDATE,
    ZORDER,
    Op,
    Scenario,
)

COMMIT = "commit"
OWNER_KEY = "eventlog.test.owner"  # the property SET TBLPROPERTIES changes


# --------------------------------------------------------------------------- tables


def _seed_rows(ids: list[int]) -> pa.Table:
    """Rows of both dates in one batch: unpartitioned, every file holds rows of each date."""
    return pa.concat_tables([rows(ids, D1), rows(ids, D2)])


def _properties(isolation: str, dvs: bool) -> dict[str, str]:
    props = {"delta.isolationLevel": isolation}
    if dvs:
        props["delta.enableDeletionVectors"] = "true"
    return props


def _copy_table(src: Path, dst: Path, *, with_slots: bool = True) -> None:
    ignore = None if with_slots else shutil.ignore_patterns("_eventlog")
    shutil.copytree(src, dst, symlinks=True, ignore=ignore)


def _data_files(root: Path) -> set[Path]:
    """Relative paths of a table's data and deletion-vector files."""
    return {
        p.relative_to(root)
        for p in root.rglob("*")
        if p.is_file() and not {"_delta_log", "_eventlog"} & set(p.relative_to(root).parts)
    }


class Workspace:
    """Starting tables (one per isolation level, layout and DV setting), copied per scenario,
    and each operation's actions made by running it alone (cached)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._seeds: dict[tuple[str, bool, bool], Path] = {}
        self._solo: dict[tuple[Any, ...], tuple[Path, list[str]]] = {}
        self._lock = threading.Lock()
        self._count = 0
        self._key_locks: dict[tuple[Any, ...], threading.Lock] = {}

    def fresh(self, name: str) -> Path:
        with self._lock:
            self._count += 1
            return self.root / f"{name}-{self._count}"

    def _key_lock(self, key: tuple[Any, ...]) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def seed(self, s: Scenario) -> Path:
        """The starting table: version 2, two appends of ids 1-2 and 3-4 on both dates."""
        key = (s.isolation, s.partitioned, s.dvs)
        with self._key_lock(("seed", *key)):
            if key not in self._seeds:
                path = self.fresh("seed")
                t = Table.create(
                    str(path),
                    SCHEMA,
                    partition_by=["date"] if s.partitioned else None,
                    properties=_properties(s.isolation, s.dvs),
                )
                t.append(_seed_rows([1, 2]))
                t.append(_seed_rows([3, 4]))
                t.close()
                self._seeds[key] = path
            return self._seeds[key]

    def solo(self, s: Scenario, op: Op, role: str) -> tuple[Path, list[str]]:
        """``op`` run alone by our engine on a copy of the starting table (or on an empty
        path): that copy, and the JSON lines of the commit it made."""
        key = (s.family == "create", s.isolation, s.partitioned, s.dvs, op, role)
        with self._key_lock(("solo", *key)):
            if key not in self._solo:
                path = self.fresh("solo")
                if s.family == "create":
                    txn = _create_transaction(Table.handle(str(path)), s, op)
                    version = 0
                else:
                    _copy_table(self.seed(s), path)
                    table = Table.open(str(path))
                    txn = table.transaction()
                    stage(txn, op, s.partitioned, role)
                    version = table.version + 1
                txn.commit()
                txn.table.close()  # type: ignore[attr-defined]
                log = path / "_delta_log" / f"{version:020d}.json"
                self._solo[key] = (path, log.read_text().splitlines())
            return self._solo[key]


# --------------------------------------------------------------------------- our side


def stage(txn: Transaction, op: Op, partitioned: bool, role: str) -> None:
    """Run ``op`` in ``txn`` (staged on its snapshot; committed by the caller)."""
    d = op.date or D1
    if op.kind == INSERT:
        txn.append(rows([1], d))  # x = 1: rows the DML of the same date would match
    elif op.kind == APP_TXN:
        assert op.app_id is not None and op.app_version is not None
        assert txn.idempotent(op.app_id, op.app_version)
        txn.append(rows([1], d))
    elif op.kind == UPDATE:
        txn.update(f"date = '{d}' AND x = 1", set={"y": "y + 10"})
    elif op.kind == DELETE:
        txn.delete(f"date = '{d}' AND x = 1")
    elif op.kind == MERGE:
        source = rows([1], d).set_column(3, "y", pa.array([-1.0]))
        txn.merge(source, f"t.id = s.id AND t.date = '{d}'", source_alias="s", target_alias="t") \
            .when_matched_update_all().execute()  # fmt: skip
    elif op.kind in (OPTIMIZE, ZORDER):
        txn.optimize(
            zorder_by=["x"] if op.kind == ZORDER else None,
            partition_filter=f"date = '{d}'" if partitioned else None,
        )
    elif op.kind == SET_PROPS:
        txn.set_properties({OWNER_KEY: role})
    elif op.kind == ENABLE_DVS:
        txn.set_properties({"delta.enableDeletionVectors": "true"})
    else:
        raise AssertionError(op.kind)


def _create_transaction(handle: Table, s: Scenario, op: Op) -> Transaction:
    """What ``Table.create(..., data=...)`` stages, on a handle that read the empty path."""
    schema = canonical_schema(SCHEMA)
    parts = ["date"] if s.partitioned else []
    props = _properties(s.isolation, s.dvs)
    txn = Transaction(handle, None)
    txn.set_operation(CREATE, {"isManaged": "false", "partitionBy": parts, "properties": props})
    txn.update_protocol(protocol_for(schema, props))
    txn.update_metadata(new_table_metadata(schema, parts, props, name=None, description=None))
    write_rows(txn, conform(_seed_rows([1, 2] if op.date == D1 else [3, 4]), schema, context="create"))
    return txn


def run_ours(ws: Workspace, s: Scenario) -> str:
    path = ws.fresh("ours")
    if s.family == "create":
        h1, h2 = Table.handle(str(path)), Table.handle(str(path))
        second = _create_transaction(h2, s, s.second)
        first = _create_transaction(h1, s, s.first)
    else:
        _copy_table(ws.seed(s), path)
        h1, h2 = Table.open(str(path)), Table.open(str(path))
        second = h2.transaction()
        stage(second, s.second, s.partitioned, "second")
        first = h1.transaction()
        stage(first, s.first, s.partitioned, "first")
    try:
        first.commit()
        try:
            second.commit()
        except DeltaConcurrentModificationException as exc:
            return type(exc).__name__
        return COMMIT
    finally:
        h1.close()
        h2.close()


# --------------------------------------------------------------------------- Delta Spark's side


@dataclass
class DeltaOutcome:
    outcome: str
    detail: str = ""


class DeltaPeer:
    """Delta Spark's transaction API, driven over py4j."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.jvm = spark._jvm
        self.parser = spark._jsparkSession.sessionState().sqlParser()
        self.delta = self.jvm.org.apache.spark.sql.delta
        self.ops = lambda name: getattr(self.delta, f"DeltaOperations${name}")

    # scala values
    def seq(self, items: Iterable[Any]) -> Any:
        lst = self.jvm.java.util.ArrayList()
        for i in items:
            lst.add(i)
        return self.jvm.org.apache.spark.api.python.PythonUtils.toSeq(lst)

    def some(self, value: Any) -> Any:
        return self.jvm.scala.Option.apply(value)

    def none(self) -> Any:
        return self.jvm.scala.Option.empty()

    def smap(self, items: dict[str, str]) -> Any:
        m = self.jvm.java.util.HashMap()
        for k, v in items.items():
            m.put(k, v)
        return self.jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(m)

    def expr(self, sql: str) -> Any:
        return self.parser.parseExpression(sql)

    # one transaction
    def record_reads(self, txn: Any, op: Op, partitioned: bool) -> None:
        """The reads Delta Spark's own command for ``op`` records."""
        d = op.date or D1
        if op.kind in (UPDATE, DELETE):
            txn.filterFiles(self.seq([self.expr(f"date = '{d}'"), self.expr("x = 1")]), True)
        elif op.kind == MERGE:
            # the target-only conjuncts of the ON condition
            txn.filterFiles(self.seq([self.expr(f"date = '{d}'")]), True)
        elif op.kind in (OPTIMIZE, ZORDER):
            preds = [self.expr(f"date = '{d}'")] if partitioned else []
            txn.filterFiles(self.seq(preds), True)
        elif op.kind == APP_TXN:
            txn.txnVersion(op.app_id)

    def operation(self, op: Op, role: str, partitioned: bool, metadata: Any) -> Any:
        d = op.date or D1
        if op.kind in (INSERT, APP_TXN):
            parts = self.some(self.seq(["date"] if partitioned else []))
            append = self.jvm.org.apache.spark.sql.SaveMode.Append
            return self.ops("Write")(append, parts, *[self.none() for _ in range(7)])
        if op.kind == DELETE:
            return self.ops("Delete")(self.seq([self.expr(f"date = '{d}' AND x = 1")]))
        if op.kind == UPDATE:
            return self.ops("Update")(self.some(self.expr(f"date = '{d}' AND x = 1")))
        if op.kind == MERGE:
            matched = self.ops("MergePredicate")(self.none(), "update")
            return self.ops("Merge")(
                self.some(self.expr(f"t.id = s.id AND t.date = '{d}'")),
                self.none(), self.none(), self.none(),
                self.seq([matched]), self.seq([]), self.seq([]),
            )  # fmt: skip
        if op.kind in (OPTIMIZE, ZORDER):
            preds = [self.expr(f"date = '{d}'")] if partitioned else []
            zorder = ["x"] if op.kind == ZORDER else []
            return self.ops("Optimize")(self.seq(preds), self.seq(zorder), False, self.none(), False)
        if op.kind == SET_PROPS:
            return self.ops("SetTableProperties")(self.smap({OWNER_KEY: role}))
        if op.kind == ENABLE_DVS:
            return self.ops("SetTableProperties")(self.smap({"delta.enableDeletionVectors": "true"}))
        if op.kind == CREATE:
            return self.ops("CreateTable")(metadata, False, True, self.none())
        raise AssertionError(op.kind)

    def actions(self, lines: list[str]) -> tuple[Any, Any]:
        """Delta actions of our commit's JSON lines, and its metadata change if any.

        commitInfo is left out (Delta writes its own); so are metadata and protocol, which go
        through ``updateMetadata`` as Delta's own ALTER TABLE and CREATE TABLE do, letting
        Delta derive the protocol (ours and Delta's agree on it; given both ways, Delta
        refuses a second protocol change in one transaction)."""
        action = self.delta.actions.Action
        out, metadata = [], None
        for line in lines:
            obj = json.loads(line)
            if "commitInfo" in obj or "protocol" in obj:
                continue
            a = action.fromJson(json.dumps(obj))
            if "metaData" in obj:
                metadata = a
            else:
                out.append(a)
        return self.seq(out), metadata

    def run_group(self, ws: Workspace, group: list[Scenario]) -> dict[str, DeltaOutcome]:
        """Run scenarios that share their starting table and first transaction (see
        :func:`group_key`) on one Delta table: all transactions start at version v and record
        their reads, the first commits v+1, then each second commits in turn. A second that
        commits is taken back (its commit file deleted) before the next one commits, so each
        meets exactly one winning commit, v+1, as in its own scenario."""
        s0 = group[0]
        path = ws.fresh("delta")
        if s0.family == "create":
            assert len(group) == 1
            path.mkdir()
        else:
            _copy_table(ws.seed(s0), path, with_slots=False)
        sides = [(s0.first, "first", s0)] + [(s.second, "second", s) for s in group]
        staged = []
        for op, role, s in sides:
            solo, lines = ws.solo(s, op, role)
            for rel in _data_files(solo):
                target = path / rel
                if not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(solo / rel, target)
            actions, metadata = self.actions(lines)
            staged.append((op, actions, metadata, self.operation(op, role, s.partitioned, metadata)))
        log = self.delta.DeltaLog.forTable(self.spark._jsparkSession, str(path))
        txns = [log.startTransaction() for _ in staged]  # all read version v
        for txn, (op, _, metadata, _) in zip(txns, staged, strict=True):
            self.record_reads(txn, op, s0.partitioned)
            if metadata is not None and op.kind == CREATE:
                txn.updateMetadataForNewTable(metadata)
            elif metadata is not None:
                txn.updateMetadata(metadata, False)
        (_, actions1, _, op1), *seconds = staged
        result = _java_call(lambda: txns[0].commit(actions1, op1))
        if result is not None:
            failed = DeltaOutcome(f"first failed: {result[0]}", result[1])
            return {s.id: failed for s in group}
        won = int(txns[0].readVersion()) + 1
        out = {}
        for s, txn, (_, actions, _, op) in zip(group, txns[1:], seconds, strict=True):
            result = _java_call(lambda txn=txn, actions=actions, op=op: txn.commit(actions, op))
            if result is None:
                out[s.id] = DeltaOutcome(COMMIT)
                for name in (f"{won + 1:020d}.json", f"{won + 1:020d}.crc"):
                    for file in (name, f".{name}.crc"):  # and Hadoop's checksum of it
                        (path / "_delta_log" / file).unlink(missing_ok=True)
            else:
                name, message = result
                out[s.id] = DeltaOutcome(name.rsplit(".", 1)[-1], f"{name}: {message}")
        return out


def group_key(s: Scenario) -> tuple[Any, ...]:
    """Scenarios with one key share their starting table and first transaction."""
    if s.family == "create":
        return (s.id,)
    return (s.isolation, s.partitioned, s.dvs, s.first)


def _java_call(call: Callable[[], object]) -> tuple[str, str] | None:
    """None if ``call`` returns; else the Java exception's class name and message."""
    from py4j.protocol import Py4JJavaError

    try:
        call()
    except Py4JJavaError as exc:
        java = exc.java_exception
    except Exception as exc:  # pyspark's converted exceptions keep the Java one
        java = getattr(exc, "_origin", None)
        if java is None:
            raise
        java = getattr(java, "java_exception", java)
    else:
        return None
    return str(java.getClass().getName()), str(java.getMessage())
