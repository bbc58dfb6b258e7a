"""The conflict scenarios run on our engine and on Delta Spark (tests/deltaspark/test_conflicts.py).

Every scenario starts from the same table, and both transactions read its version v: the
first commits, then the second commits. The outcome is "commit" or the conflict's exception
class (our exceptions keep Delta's names).

The families, from ../shared/reference/isolation-and-conflicts.md:

* ``matrix``: second \\ first over INSERT (blind append), UPDATE, DELETE, MERGE, OPTIMIZE and
  OPTIMIZE ZORDER BY, on a table partitioned by ``date`` (the two operations on the same or
  on different partitions) or unpartitioned (the same or different rows: every data file holds
  rows of both dates, so different rows still share files);
* ``metadata``: SET TBLPROPERTIES against every operation, both ways;
* ``protocol``: enabling deletion vectors (a protocol upgrade) against every operation, both ways;
* ``app-id``: idempotent writes (``txn`` actions) with the same or different app ids;
* ``create``: two writers creating a table at one empty path;

each under ``delta.isolationLevel`` Serializable and WriteSerializable, with deletion vectors
enabled or not.

Where our outcome differs from Delta Spark's, the scenario is listed here with its reason:
:data:`INTENDED` (our row-level concurrency, the Databricks behaviour OSS Delta Spark lacks)
or :data:`BUGS` (differences to fix; their tests are strict xfails).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import NamedTuple

SER = "Serializable"
WS = "WriteSerializable"
LEVELS = (SER, WS)
D1 = "2024-01-01"
D2 = "2024-01-02"

INSERT = "INSERT"
UPDATE = "UPDATE"
DELETE = "DELETE"
MERGE = "MERGE"
OPTIMIZE = "OPTIMIZE"
ZORDER = "OPTIMIZE ZORDER"
SET_PROPS = "SET TBLPROPERTIES"
ENABLE_DVS = "ENABLE DELETION VECTORS"
APP_TXN = "APP TXN"
CREATE = "CREATE TABLE AS SELECT"

MATRIX_OPS = (INSERT, UPDATE, DELETE, MERGE, OPTIMIZE, ZORDER)
DML = (UPDATE, DELETE, MERGE)


@dataclass(frozen=True)
class Op:
    """One transaction's operation. ``date``: the partition (or rows) it touches; ``app_id``
    and ``app_version``: an idempotent write's ``txn`` action (``APP_TXN``)."""

    kind: str
    date: str | None = None
    app_id: str | None = None
    app_version: int | None = None

    @property
    def label(self) -> str:
        if self.kind == APP_TXN:
            return f"{INSERT} txn({self.app_id}, {self.app_version})"
        return self.kind

    def targets(self, partitioned: bool) -> bool:
        """Whether the date matters: an unpartitioned OPTIMIZE compacts the whole table."""
        return self.date is not None and (partitioned or self.kind not in (OPTIMIZE, ZORDER))


@dataclass(frozen=True)
class Scenario:
    family: str
    first: Op
    second: Op
    isolation: str
    layout: str  # "partitioned" or "unpartitioned" (for "create": of the table created)
    target: str  # "same" / "disjoint" partitions or rows; "-" when it does not apply
    dvs: bool

    @property
    def partitioned(self) -> bool:
        return self.layout == "partitioned"

    @property
    def id(self) -> str:
        where = self.layout if self.target == "-" else f"{self.layout}-{self.target}"
        dv = "dv" if self.dvs else "nodv"
        return f"{self.second.label} after {self.first.label} | {self.isolation} | {where} | {dv}"

    @property
    def test_id(self) -> str:
        """The id as pytest's ``-k`` can select it (``UPDATE_after_DELETE-Serializable-...``)."""
        return re.sub(r"[^\w.-]+", "_", self.id.replace(" | ", "-")).replace("_-", "-").strip("_")


def _matrix() -> list[Scenario]:
    out = []
    for layout, target, level, dvs in itertools.product(
        ("partitioned", "unpartitioned"), ("same", "disjoint"), LEVELS, (False, True)
    ):
        partitioned = layout == "partitioned"
        for first_kind, second_kind in itertools.product(MATRIX_OPS, MATRIX_OPS):
            first = Op(first_kind, D1)
            second = Op(second_kind, D1 if target == "same" else D2)
            if target == "disjoint" and not (first.targets(partitioned) and second.targets(partitioned)):
                continue  # the same scenario as "same"
            out.append(Scenario("matrix", first, second, level, layout, target, dvs))
    return out


def _table_changes() -> list[Scenario]:
    out = []
    for layout, level, dvs in itertools.product(("partitioned", "unpartitioned"), LEVELS, (False, True)):
        changes = [SET_PROPS] if dvs else [SET_PROPS, ENABLE_DVS]  # DVs already enabled
        pairs = [(c, o) for c in changes for o in (*MATRIX_OPS, *changes)]
        pairs += [(o, c) for c in changes for o in MATRIX_OPS]
        for first_kind, second_kind in pairs:
            family = "protocol" if ENABLE_DVS in (first_kind, second_kind) else "metadata"
            first, second = Op(first_kind, D1), Op(second_kind, D1)
            out.append(Scenario(family, first, second, level, layout, "-", dvs))
    return out


def _app_ids() -> list[Scenario]:
    pairs = [
        (Op(APP_TXN, D1, "app-a", 1), Op(APP_TXN, D1, "app-a", 1)),  # one query started twice
        (Op(APP_TXN, D1, "app-a", 1), Op(APP_TXN, D1, "app-a", 2)),
        (Op(APP_TXN, D1, "app-a", 1), Op(APP_TXN, D1, "app-b", 1)),
        (Op(INSERT, D1), Op(APP_TXN, D1, "app-a", 1)),
        (Op(APP_TXN, D1, "app-a", 1), Op(INSERT, D1)),
        (Op(APP_TXN, D1, "app-a", 1), Op(DELETE, D1)),
    ]
    return [
        Scenario("app-id", first, second, level, layout, "-", dvs)
        for layout, level, dvs in itertools.product(("partitioned", "unpartitioned"), LEVELS, (False, True))
        for first, second in pairs
    ]


def _creates() -> list[Scenario]:
    return [
        Scenario("create", Op(CREATE, D1), Op(CREATE, D2), level, layout, "-", dvs)
        for layout, level, dvs in itertools.product(("partitioned", "unpartitioned"), LEVELS, (False, True))
    ]


SCENARIOS: list[Scenario] = [*_matrix(), *_table_changes(), *_app_ids(), *_creates()]
BY_ID: dict[str, Scenario] = {s.id: s for s in SCENARIOS}
assert len(BY_ID) == len(SCENARIOS), "scenario ids must be unique"


class Difference(NamedTuple):
    """An outcome of ours that differs from Delta Spark's on purpose, and why."""

    ours: str
    delta: str
    reason: str


APPEND = "ConcurrentAppendException"
DELETE_READ = "ConcurrentDeleteReadException"
COMMIT = "commit"

# Row-level concurrency (eventlog/txn/conflicts.py, eventlog/txn/rowlevel.py) applies to tables
# with deletion vectors: without partition columns, the Databricks contract of
# isolation-and-conflicts.md ("Row-level concurrency"); with them, the same rules beyond that
# contract (a file lies in one partition; a winner's new rows must also lie in a partition the
# loser selects). OSS Delta Spark has none (its ConflictChecker compares file paths;
# delta-io/delta#7360 is open), and on an unpartitioned table any add of a concurrent
# non-blind commit fails a transaction that read the table. In the matrix the partitioned
# cells that differ are those on the same partition: different partitions agree anyway.
_RLC = {
    "unpartitioned": (
        "row-level concurrency (unpartitioned, deletion vectors; Databricks' documented behaviour): "
    ),
    "partitioned": "row-level concurrency (partitioned, deletion vectors; Databricks' rules, beyond its "
    "unpartitioned tables): ",
}
BOTH = ("unpartitioned", "partitioned")

# Scenarios whose outcome differs from Delta Spark's on purpose.
INTENDED: dict[str, Difference] = {}


def _intended(
    seconds: tuple[str, ...],
    firsts: tuple[str, ...],
    target: str,
    levels: tuple[str, ...],
    diff: Difference,
    layouts: tuple[str, ...] = ("unpartitioned",),
) -> None:
    """List the matrix cells second x first (in ``layouts``, with deletion vectors) as intended."""
    for layout, second, first, level in itertools.product(layouts, seconds, firsts, levels):
        other = D1 if target == "same" else D2
        s = Scenario("matrix", Op(first, D1), Op(second, other), level, layout, target, True)
        INTENDED[s.id] = diff._replace(reason=_RLC[layout] + diff.reason)


_intended(DML, DML, "disjoint", LEVELS, Difference(COMMIT, APPEND, (
    "the two change different rows of the same files, so ours merges their deletion vectors and "
    "commits (DML vs DML conflicts only when the same row is modified); Delta Spark fails on the "
    "first's re-add of the shared file")))  # fmt: skip
_intended(DML, (INSERT,), "disjoint", (SER,), Difference(COMMIT, APPEND, (
    "under Serializable an append conflicts only with the rows it may match: the appended file's "
    "statistics (other date) cannot match this DML's predicate, so ours commits; Delta Spark "
    "fails on any add to an unpartitioned table it read")))  # fmt: skip
_intended(DML, (OPTIMIZE,), "same", LEVELS, Difference(COMMIT, APPEND, (
    "a compaction without ZORDER BY cannot conflict with DML: ours moves the rows it deletes to "
    "their place in the compacted file; Delta Spark counts OPTIMIZE's adds as new data")), BOTH)  # fmt: skip
_intended((OPTIMIZE,), DML, "same", LEVELS, Difference(COMMIT, DELETE_READ, (
    "a compaction without ZORDER BY cannot conflict with DML: ours carries the rows the DML "
    "deleted into the compacted file; Delta Spark fails on the removed file it read")), BOTH)  # fmt: skip
_intended((OPTIMIZE,), (OPTIMIZE, ZORDER), "same", LEVELS, Difference(COMMIT, DELETE_READ, (
    "the first already rewrote every file this compaction rewrites, and a compaction changes no "
    "data: ours drops it and commits; Delta Spark fails on the removed files it read")), BOTH)  # fmt: skip
_intended(DML, (DELETE,), "same", LEVELS, Difference(DELETE_READ, APPEND, (
    "both fail (the same row is changed twice); a deletion-vector re-add carries no new rows, so "
    "ours reports the conflict as the delete it is, Delta Spark as an append")), BOTH)  # fmt: skip
_intended(DML, (ZORDER,), "same", LEVELS, Difference(DELETE_READ, APPEND, (
    "both fail (a Z-ordered rewrite cannot carry row-level deletes); a compaction's outputs carry "
    "no new rows, so ours reports the rewritten files this DML changes, Delta Spark counts "
    "OPTIMIZE's adds as an append")), BOTH)  # fmt: skip

# Differences to fix (each test is a strict xfail): id -> what differs.
BUGS: dict[str, str] = {}
