"""The MERGE planner as a pure function: (schemas, aliases, ON, clauses) -> MergePlan.

Both MERGE executors (pyarrow in eventlog.ops.merge, Spark jobs in spark_adapter.ops.merge)
plan with it, so what is checked here holds for both: the ON split and the read set, clause
resolution and choice, the cardinality rule, the typed errors and commitInfo.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table
from eventlog import expr as ex
from eventlog.errors import (
    AppendOnlyViolationError,
    InvalidInputError,
    MergeCardinalityError,
    PredicateError,
    UnknownColumnError,
)
from eventlog.ops.mergeplan import (
    ClauseSpec,
    MergeClause,
    MergeScope,
    begin_merge,
    cardinality_error,
    checks_cardinality,
    choose_clause,
    clause_cases,
    merge_metrics,
    merge_parameters,
    unqualify,
)
from eventlog.txn.plan import PlanBuilder
from tests.conftest import SCHEMA, rows

SOURCE = pa.schema([("id", pa.int64()), ("date", pa.string()), ("x", pa.int64()), ("y", pa.float64())])
SCOPE = MergeScope(SCHEMA, SOURCE, "t", "s")


def _plan(on: str, *clauses: ClauseSpec[str]) -> Any:
    resolved = [SCOPE.resolve(c) for c in clauses] or [SCOPE.resolve(ClauseSpec.update_all(None))]
    matched = [c for c in resolved if c.matched]
    not_matched = [c for c in resolved if not c.matched]
    return SCOPE.plan(on, SCOPE.parse_on(on), matched, not_matched)


def _sql(e: ex.Expr | None) -> str | None:
    return None if e is None else ex.to_sql(e)


# --------------------------------------------------------------------------- ON split


def test_on_splits_into_keys_target_predicate_and_residual() -> None:
    plan = _plan(
        "t.id = s.id AND s.date = t.date AND t.date = '2024-01-01' AND t.x > s.x AND s.y > 0 AND t.y < 5"
    )
    assert plan.keys == (("id", "id"), ("date", "date"))  # either side may come first
    assert [ex.to_sql(e) for e in plan.target_only] == ["t.date = '2024-01-01'", "t.y < 5"]
    assert [ex.to_sql(e) for e in plan.residual] == ["t.x > s.x", "s.y > 0"]
    # The read set: the target-only conjuncts, unqualified, as scans on the target need them.
    assert _sql(plan.target_predicate) == "date = '2024-01-01' AND y < 5"
    assert plan.on_sql.startswith("t.id = s.id") and plan.on is not None


def test_without_target_only_conjuncts_the_whole_target_is_read() -> None:
    plan = _plan("t.id = s.id AND t.x = s.x + 1")
    assert plan.keys == (("id", "id"),)
    assert plan.target_only == () and plan.target_predicate is None
    assert [ex.to_sql(e) for e in plan.residual] == ["t.x = s.x + 1"]


def test_an_equality_between_target_columns_is_not_a_join_key() -> None:
    plan = _plan("t.id = s.id AND t.x = t.id")
    assert plan.keys == (("id", "id"),) and _sql(plan.target_predicate) == "x = id"


@pytest.mark.parametrize("on", ["t.x > s.x", "t.id = 1", "t.id = s.id + 0", "t.id = s.id OR t.x = s.x"])
def test_on_needs_an_equality_between_a_target_and_a_source_column(on: str) -> None:
    with pytest.raises(PredicateError) as info:
        _plan(on)
    assert info.value.expression == on


def test_an_on_the_executor_evaluates_itself_reads_the_whole_target() -> None:
    # Spark-only syntax, or a Spark Column without SQL text: no split, no read predicate.
    assert SCOPE.parse_on_if_possible("t.id = s.id AND t.x RLIKE 'a'", strict_columns=True) is None
    assert SCOPE.parse_on_if_possible(None, strict_columns=True) is None
    assert SCOPE.parse_on_if_possible("t.nope = s.id", strict_columns=False) is None
    with pytest.raises(UnknownColumnError) as info:
        SCOPE.parse_on_if_possible("t.nope = s.id", strict_columns=True)
    assert (info.value.column, info.value.context) == ("t.nope", "merge ON")
    clause = SCOPE.resolve(ClauseSpec[str].delete(None))
    plan = SCOPE.plan("t.id = s.id AND t.x RLIKE 'a'", None, [clause], [])
    assert (plan.keys, plan.target_only, plan.residual, plan.target_predicate) == ((), (), (), None)


def test_aliases_must_differ() -> None:
    with pytest.raises(InvalidInputError, match="must differ"):
        MergeScope(SCHEMA, SOURCE, "x", "x")


def test_unqualify_drops_qualifiers_everywhere() -> None:
    expr = ex.parse_predicate("t.x + 1 > 2 AND t.date IN ('a')", SCHEMA, qualifiers=SCOPE.qualifiers)
    assert {c.qualifier for c in ex.referenced_columns(unqualify(expr))} == {None}


# --------------------------------------------------------------------------- clauses


def test_set_columns_resolve_case_insensitively_and_may_be_qualified() -> None:
    clause = SCOPE.resolve(ClauseSpec.update("s.x > 0", {"X": "s.x", "t.Y": "t.y + s.y"}, method="m"))
    assert clause.kind == "update" and clause.matched
    assert dict(clause.values) == {"x": "s.x", "y": "t.y + s.y"}
    assert {k: ex.to_sql(v) for k, v in clause.assignments.items()} == {"x": "s.x", "y": "t.y + s.y"}
    assert _sql(clause.predicate) == "s.x > 0" and clause.condition_sql == "s.x > 0"
    assert clause.from_source == {}


def test_all_expands_from_the_source_columns() -> None:
    narrow = MergeScope(SCHEMA, pa.schema([("ID", pa.int64()), ("x", pa.int64())]), "t", "s")
    clause = narrow.resolve(ClauseSpec[str].insert_all(None))
    assert clause.kind == "insert" and not clause.matched
    assert dict(clause.from_source) == {"id": "ID", "x": "x"}  # target order, source spelling
    assert dict(clause.assignments) == {"id": ex.Column("ID", "s"), "x": ex.Column("x", "s")}


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (pa.schema([("other", pa.int64())]), "shares no column"),
        (pa.schema([("id", pa.int64()), ("extra", pa.int64())]), r"not in the target: \['extra'\]"),
    ],
)
def test_all_needs_a_source_that_fits_the_target(source: pa.Schema, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        MergeScope(SCHEMA, source, "t", "s").resolve(ClauseSpec[str].update_all(None))


def test_bad_clauses_are_typed_errors() -> None:
    with pytest.raises(InvalidInputError, match="when_matched_update needs a non-empty set mapping"):
        ClauseSpec.update(None, {}, method="when_matched_update")
    with pytest.raises(InvalidInputError, match="whenNotMatchedInsert needs a non-empty values mapping"):
        ClauseSpec[str].insert(None, None, method="whenNotMatchedInsert")
    with pytest.raises(UnknownColumnError) as unknown:
        SCOPE.resolve(ClauseSpec.update(None, {"t.nope": "1"}, method="m"))
    assert (unknown.value.column, unknown.value.context) == ("t.nope", "merge SET")
    assert unknown.value.available == SCHEMA.names
    with pytest.raises(PredicateError):
        SCOPE.resolve(ClauseSpec[str].delete("s.x >"))
    with pytest.raises(InvalidInputError, match="at least one WHEN clause"):
        SCOPE.plan("t.id = s.id", SCOPE.parse_on("t.id = s.id"), [], [])


def test_unparsed_clauses_keep_the_executors_own_values() -> None:
    # The Spark executor evaluates conditions and values itself: they are resolved, not parsed.
    opaque = object()
    spec = ClauseSpec[Any].update(opaque, {"x": opaque, "Y": "anything Spark understands"}, method="m")
    clause = SCOPE.resolve(spec, parse=False, sql=lambda v: "rendered" if v is opaque else None)
    assert clause.condition is opaque and clause.condition_sql == "rendered"
    assert dict(clause.values) == {"x": opaque, "y": "anything Spark understands"}
    assert clause.predicate is None and clause.assignments == {}
    no_sql = SCOPE.resolve(ClauseSpec[Any].delete(opaque), parse=False, sql=lambda v: None)
    assert no_sql.condition is opaque and no_sql.condition_sql is None


# --------------------------------------------------------------------------- choice and cardinality


def _clauses(*specs: tuple[str, str | None]) -> list[MergeClause[str]]:
    return [MergeClause(kind, cond) for kind, cond in specs]  # type: ignore[arg-type]


def test_the_first_clause_whose_condition_holds_applies() -> None:
    clauses = _clauses(("delete", "a"), ("update", "b"), ("update", None), ("delete", "c"))
    # The cases stop at the first unconditional clause: later ones can never apply.
    assert [i for i, _ in clause_cases(clauses)] == [0, 1, 2]

    def row(**holds: bool | None) -> int | None:
        return choose_clause(clauses, lambda c: holds.get(c.condition or ""))

    assert row(a=True, b=True) == 0
    assert row(a=False, b=True) == 1
    assert row(a=None, b=True) == 1  # NULL does not hold
    assert row(a=False, b=False, c=True) == 2
    conditional = _clauses(("update", "a"), ("delete", "b"))
    assert choose_clause(conditional, lambda c: False) is None  # no clause: left alone
    assert choose_clause([], lambda c: True) is None


@pytest.mark.parametrize(
    ("matched", "checked"),
    [
        ([], False),  # insert-only MERGE: duplicates never touch the target
        ([("delete", None)], False),  # deleting a row twice is deleting it once
        ([("delete", "s.x > 0")], True),
        ([("update", None)], True),
        ([("delete", None), ("update", None)], True),
    ],
)
def test_the_cardinality_rule(matched: list[tuple[str, str | None]], checked: bool) -> None:
    clauses = _clauses(*matched)
    assert checks_cardinality(clauses) is checked
    plan = SCOPE.plan("t.id = s.id", SCOPE.parse_on("t.id = s.id"), clauses, _clauses(("insert", None)))
    assert plan.checks_cardinality is checked
    err = cardinality_error(3)
    assert isinstance(err, MergeCardinalityError) and err.rows == 3 and "3 target rows" in str(err)


# --------------------------------------------------------------------------- commitInfo


def test_commit_info_parameters_and_metrics() -> None:
    plan = _plan(
        "t.id = s.id",
        ClauseSpec[str].delete("s.x < 0"),
        ClauseSpec.update(None, {"x": "s.x"}, method="m"),
        ClauseSpec[str].insert_all("s.x > 0"),
    )
    expected = {
        "predicate": "t.id = s.id",
        "matchedPredicates": [
            {"actionType": "delete", "predicate": "s.x < 0"},
            {"actionType": "update", "predicate": None},
        ],
        "notMatchedPredicates": [{"actionType": "insert", "predicate": "s.x > 0"}],
    }
    assert plan.parameters == expected
    assert merge_parameters("t.id = s.id", plan.matched, plan.not_matched) == expected
    assert merge_metrics(files_removed=1, updated=2, deleted=3, inserted=4, source_rows=5) == {
        "numTargetFilesRemoved": 1, "numTargetRowsUpdated": 2, "numTargetRowsDeleted": 3,
        "numTargetRowsInserted": 4, "numSourceRows": 5,
        "numTargetRowsNotMatchedBySourceUpdated": 0, "numTargetRowsNotMatchedBySourceDeleted": 0,
    }  # fmt: skip


def _builder(tmp_path: Path, **props: str) -> PlanBuilder:
    t = Table.create(str(tmp_path / "t"), SCHEMA, partition_by=["date"], properties=props)
    t.append(rows([1, 2], "2024-01-01"))
    return PlanBuilder(t, t.refresh())


def test_begin_merge_names_the_operation_and_refuses_append_only_tables(tmp_path: Path) -> None:
    on = "t.id = s.id AND t.date = '2024-01-01'"
    update = [SCOPE.resolve(ClauseSpec[str].update_all(None))]
    insert = [SCOPE.resolve(ClauseSpec[str].insert_all(None))]
    builder = _builder(tmp_path)
    plan = begin_merge(builder, SCOPE, on, SCOPE.parse_on(on), update, insert)
    assert _sql(plan.target_predicate) == "date = '2024-01-01'"
    built = builder.build()
    assert built.operation == "MERGE" and built.parameters["predicate"] == on
    assert built.adds == () and built.removes == ()  # planning writes nothing
    locked = _builder(tmp_path / "locked", **{"delta.appendOnly": "true"})
    with pytest.raises(AppendOnlyViolationError):
        begin_merge(locked, SCOPE, on, SCOPE.parse_on(on), update, insert)
    insert_only = _builder(tmp_path / "inserts", **{"delta.appendOnly": "true"})
    assert begin_merge(insert_only, SCOPE, on, SCOPE.parse_on(on), [], insert).not_matched
