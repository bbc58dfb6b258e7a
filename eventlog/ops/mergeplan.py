"""The MERGE planner: what a MERGE reads and which clause applies to a row, decided once.

MERGE has two executors, pyarrow in :mod:`eventlog.ops.merge` and Spark jobs in the Spark
adapter. Both plan here: from the target and source schemas, their aliases, the ON
condition and the WHEN clauses to a :class:`MergePlan` value. This module owns

* **the ON split.** ``t.col = s.col`` equalities are the join keys (at least one is
  required); target-only conjuncts (e.g. ``t.date = '2024-01-01'``) prune the target files
  and, unqualified, are the transaction's read predicate (:attr:`MergePlan.target_predicate`),
  so MERGEs with explicit, disjoint partition predicates do not conflict (Delta's documented
  fix for ConcurrentAppendException); every other conjunct is residual, evaluated on the
  joined rows;
* **clause semantics.** Kinds (update, delete, insert), SET/VALUES columns resolved against
  the target, ``*All`` expanded from the source's columns, and the choice rule: a row goes
  to the first clause, in order, whose condition holds (:func:`clause_cases`);
* **the cardinality rule.** A target row matched by several source rows is an error when an
  update or delete clause could apply to it (:attr:`MergePlan.checks_cardinality`);
* **commitInfo.** The operation's parameters and its metric names.

It reads no data. :func:`begin_merge` is its one step on a transaction: naming the operation
and refusing append-only tables, in the same order for both executors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, cast

import pyarrow as pa

from eventlog import expr as ex
from eventlog.errors import InvalidInputError, MergeCardinalityError, PredicateError, UnknownColumnError
from eventlog.ops.common import check_append_only
from eventlog.txn.plan import PlanBuilder

__all__ = [
    "ClauseKind",
    "ClauseSpec",
    "MergeClause",
    "MergePlan",
    "MergeScope",
    "begin_merge",
    "cardinality_error",
    "check_aliases",
    "checks_cardinality",
    "choose_clause",
    "clause_cases",
    "merge_metrics",
    "merge_parameters",
    "require_clauses",
    "unqualify",
]

V = TypeVar("V")  # how an executor holds conditions and values: SQL text, or Spark Columns too
ClauseKind = Literal["update", "delete", "insert"]


# --------------------------------------------------------------------------- clauses


@dataclass(frozen=True)
class ClauseSpec(Generic[V]):
    """A WHEN clause as the user wrote it; ``values`` None means ``*All`` (from the source)."""

    kind: ClauseKind
    condition: V | None = None
    values: Mapping[str, V] | None = None

    @staticmethod
    def update(condition: V | None, values: Mapping[str, V] | None, *, method: str) -> ClauseSpec[V]:
        """WHEN MATCHED THEN UPDATE SET ...; ``method`` names the call in the error."""
        if not values:
            raise InvalidInputError(f"{method} needs a non-empty set mapping")
        return ClauseSpec("update", condition, dict(values))

    @staticmethod
    def update_all(condition: V | None) -> ClauseSpec[V]:
        return ClauseSpec("update", condition, None)

    @staticmethod
    def delete(condition: V | None) -> ClauseSpec[V]:
        return ClauseSpec("delete", condition, {})

    @staticmethod
    def insert(condition: V | None, values: Mapping[str, V] | None, *, method: str) -> ClauseSpec[V]:
        """WHEN NOT MATCHED THEN INSERT VALUES ...; ``method`` names the call in the error."""
        if not values:
            raise InvalidInputError(f"{method} needs a non-empty values mapping")
        return ClauseSpec("insert", condition, dict(values))

    @staticmethod
    def insert_all(condition: V | None) -> ClauseSpec[V]:
        return ClauseSpec("insert", condition, None)


@dataclass(frozen=True)
class MergeClause(Generic[V]):
    """A WHEN clause resolved against the target and the source.

    ``condition`` and ``values`` are the executor's own objects, ``values`` keyed by the
    target column they set; ``from_source`` maps target to source columns for ``*All``.
    ``predicate`` and ``assignments`` are the parsed forms (with ``*All`` as source
    columns), present when the clause was resolved with ``parse=True``.
    """

    kind: ClauseKind
    condition: V | None = None
    condition_sql: str | None = None  # what commitInfo records (None: no condition, or no SQL)
    values: Mapping[str, V] = field(default_factory=dict)
    from_source: Mapping[str, str] = field(default_factory=dict)
    predicate: ex.Expr | None = None
    assignments: Mapping[str, ex.Expr] = field(default_factory=dict)

    @property
    def matched(self) -> bool:
        """A WHEN MATCHED clause (update or delete), not WHEN NOT MATCHED (insert)."""
        return self.kind != "insert"


def clause_cases(clauses: Sequence[MergeClause[V]]) -> list[tuple[int, MergeClause[V]]]:
    """The clause choice rule: (index, clause) in the order a row tries them.

    A row goes to the first clause whose condition holds (no condition: it always holds;
    a NULL condition does not hold), so the cases stop at the first unconditional clause;
    a row no case takes is left alone (matched) or not inserted (not matched).
    """
    out: list[tuple[int, MergeClause[V]]] = []
    for i, clause in enumerate(clauses):
        out.append((i, clause))
        if clause.condition is None:
            break
    return out


def choose_clause(
    clauses: Sequence[MergeClause[V]], holds: Callable[[MergeClause[V]], bool | None]
) -> int | None:
    """The index of the clause that applies to one row (None: none does); ``holds`` tells
    whether a clause's condition is TRUE for the row (None: NULL)."""
    for i, clause in clause_cases(clauses):
        if clause.condition is None or holds(clause) is True:
            return i
    return None


def require_clauses(*clauses: Sequence[object]) -> None:
    if not any(clauses):
        raise InvalidInputError("MERGE needs at least one WHEN clause")


def merge_parameters(
    on_sql: str | None,
    matched: Sequence[MergeClause[Any]],
    not_matched: Sequence[MergeClause[Any]],
    by_source: Sequence[MergeClause[Any]] = (),
) -> dict[str, Any]:
    """commitInfo's ``operationParameters`` of a MERGE (Delta's names)."""
    params = {
        "predicate": on_sql,
        "matchedPredicates": [{"actionType": c.kind, "predicate": c.condition_sql} for c in matched],
        "notMatchedPredicates": [{"actionType": c.kind, "predicate": c.condition_sql} for c in not_matched],
    }
    if by_source:
        params["notMatchedBySourcePredicates"] = [
            {"actionType": c.kind, "predicate": c.condition_sql} for c in by_source
        ]
    return params


def merge_metrics(
    *,
    files_removed: int,
    updated: int,
    deleted: int,
    inserted: int,
    source_rows: int,
    by_source_updated: int = 0,
    by_source_deleted: int = 0,
) -> dict[str, int]:
    """commitInfo's ``operationMetrics`` of a MERGE (Delta's names); ``updated`` and
    ``deleted`` include the rows WHEN NOT MATCHED BY SOURCE clauses changed."""
    return {
        "numTargetFilesRemoved": files_removed,
        "numTargetRowsUpdated": updated,
        "numTargetRowsDeleted": deleted,
        "numTargetRowsInserted": inserted,
        "numTargetRowsNotMatchedBySourceUpdated": by_source_updated,
        "numTargetRowsNotMatchedBySourceDeleted": by_source_deleted,
        "numSourceRows": source_rows,
    }


def checks_cardinality(matched: Sequence[MergeClause[Any]]) -> bool:
    """Whether a target row matched by several source rows is an error: whenever an update or
    delete clause could apply to it, except for one unconditional delete (deleting a row
    twice is deleting it once)."""
    if not matched:
        return False
    only = matched[0]
    return not (len(matched) == 1 and only.kind == "delete" and only.condition is None)


def cardinality_error(rows: int) -> MergeCardinalityError:
    """The error for ``rows`` target rows matched by more than one source row."""
    return MergeCardinalityError(
        f"MERGE matched {rows} target rows with more than one source row; a target row "
        "can be updated or deleted by at most one source row",
        rows=rows,
    )


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class MergePlan(Generic[V]):
    """What a MERGE reads and how each row is treated (see the module docstring).

    ``on`` is None when the executor evaluates an ON eventlog could not parse itself: then
    there are no keys and no target predicate, and the MERGE reads the whole target.
    """

    target_alias: str
    source_alias: str
    on_sql: str | None
    on: ex.Expr | None
    keys: tuple[tuple[str, str], ...]  # (target column, source column) pairs that are equal
    target_only: tuple[ex.Expr, ...]  # qualified, as written in ON
    residual: tuple[ex.Expr, ...]
    target_predicate: ex.Expr | None  # the target-only conjuncts, unqualified: the read set
    matched: tuple[MergeClause[V], ...]
    not_matched: tuple[MergeClause[V], ...]
    # WHEN NOT MATCHED BY SOURCE: target rows no source row matches. With these the MERGE
    # reads the whole target (target_predicate None); ON's target-only conjuncts still
    # decide which rows can match (join_filter).
    not_matched_by_source: tuple[MergeClause[V], ...] = ()

    @property
    def parameters(self) -> dict[str, Any]:
        return merge_parameters(self.on_sql, self.matched, self.not_matched, self.not_matched_by_source)

    @property
    def join_filter(self) -> ex.Expr | None:
        """The target-only conjuncts of ON, unqualified: the target rows that may match."""
        return unqualify(ex.conjoin(self.target_only)) if self.target_only else None

    @property
    def checks_cardinality(self) -> bool:
        return checks_cardinality(self.matched)


@dataclass(frozen=True)
class MergeScope:
    """The names a MERGE's ON and clauses resolve against: target and source, by alias."""

    target_schema: pa.Schema
    source_schema: pa.Schema
    target_alias: str = "target"
    source_alias: str = "source"

    def __post_init__(self) -> None:
        check_aliases(self.source_alias, self.target_alias)

    @property
    def qualifiers(self) -> dict[str, pa.Schema]:
        return {self.target_alias: self.target_schema, self.source_alias: self.source_schema}

    # ------------------------------------------------------------------ ON

    def parse_on(self, sql: str) -> ex.Expr:
        return ex.parse_predicate(sql, self.target_schema, qualifiers=self.qualifiers, context="merge ON")

    def parse_on_if_possible(self, sql: str | None, *, strict_columns: bool) -> ex.Expr | None:
        """ON for an executor that can evaluate it itself (Spark): None when there is no SQL
        text or eventlog cannot parse it (Spark-only syntax). The MERGE then reads the whole
        target: a wider read set, so conflicts stay detectable. ``strict_columns`` (ON was
        SQL text from the user): an unknown column still raises."""
        if sql is None:
            return None
        try:
            return self.parse_on(sql)
        except UnknownColumnError:
            if strict_columns:
                raise
            return None
        except PredicateError:
            return None

    def split_on(
        self, on: ex.Expr, on_sql: str | None
    ) -> tuple[list[tuple[str, str]], list[ex.Expr], list[ex.Expr]]:
        """(join keys, target-only conjuncts, residual conjuncts) of a parsed ON."""
        keys: list[tuple[str, str]] = []
        target_only: list[ex.Expr] = []
        residual: list[ex.Expr] = []
        for conj in ex.conjuncts(on):
            quals = {c.qualifier for c in ex.referenced_columns(conj)}
            if (
                isinstance(conj, ex.Call)
                and conj.op == "eq"
                and all(isinstance(a, ex.Column) for a in conj.args)
            ):
                a, b = conj.args
                assert isinstance(a, ex.Column) and isinstance(b, ex.Column)
                if {a.qualifier, b.qualifier} == {self.target_alias, self.source_alias}:
                    t, s = (a, b) if a.qualifier == self.target_alias else (b, a)
                    keys.append((t.name, s.name))
                    continue
            if quals == {self.target_alias}:
                target_only.append(conj)
            else:
                residual.append(conj)
        if not keys:
            raise PredicateError(
                "MERGE needs at least one equality between a target and a source column in ON",
                expression=cast(str, on_sql),
            )
        return keys, target_only, residual

    # ------------------------------------------------------------------ clauses

    def target_column(self, column: str) -> str:
        """The target column a SET/VALUES key names (``t.x``, ``X``: case-insensitive)."""
        names: list[str] = self.target_schema.names
        by_lower = {n.lower(): n for n in names}
        name = by_lower.get(column.split(".")[-1].lower())
        if name is None:
            raise UnknownColumnError(column, list(names), "merge SET")
        return name

    def from_source(self) -> dict[str, str]:
        """``*All``: target column -> the source column of the same name (case-insensitive).
        The source must share a column with the target and have none the target lacks."""
        source_names = {n.lower(): n for n in self.source_schema.names}
        out = {n: source_names[n.lower()] for n in self.target_schema.names if n.lower() in source_names}
        if not out:
            raise InvalidInputError("the merge source shares no column with the target")
        extra = sorted(set(source_names) - {n.lower() for n in self.target_schema.names})
        if extra:
            raise InvalidInputError(f"merge source columns not in the target: {extra}")
        return out

    def resolve(
        self, spec: ClauseSpec[V], *, parse: bool = True, sql: Callable[[V], str | None] | None = None
    ) -> MergeClause[V]:
        """Resolve a clause: its columns against the target, ``*All`` against the source, and
        (``parse``) its condition and values as eventlog SQL. ``sql`` renders the executor's
        condition for commitInfo (default: it is the SQL text)."""
        cond = spec.condition
        predicate = None
        if parse and cond is not None:
            predicate = ex.parse_predicate(
                cast(str, cond), self.target_schema, qualifiers=self.qualifiers, context="merge clause"
            )
        values: dict[str, V] = {}
        from_source: dict[str, str] = {}
        assignments: dict[str, ex.Expr] = {}
        if spec.kind != "delete" and spec.values is None:
            from_source = self.from_source()
            assignments = {t: ex.Column(s, self.source_alias) for t, s in from_source.items()}
        elif spec.kind != "delete":
            for column, value in (spec.values or {}).items():
                name = self.target_column(column)
                values[name] = value
                if parse:
                    assignments[name] = ex.parse_expression(
                        cast(str, value), self.target_schema, qualifiers=self.qualifiers,
                        context=f"merge SET {name}",
                    )  # fmt: skip
        if cond is None:
            cond_sql = None
        else:
            cond_sql = sql(cond) if sql is not None else cast(str, cond)
        return MergeClause(spec.kind, cond, cond_sql, values, from_source, predicate, assignments)

    # ------------------------------------------------------------------ plan

    def plan(
        self,
        on_sql: str | None,
        on: ex.Expr | None,
        matched: Sequence[MergeClause[V]],
        not_matched: Sequence[MergeClause[V]],
        by_source: Sequence[MergeClause[V]] = (),
    ) -> MergePlan[V]:
        """The MERGE's plan; ``on`` is ``on_sql`` parsed (None: the executor evaluates it)."""
        require_clauses(matched, not_matched, by_source)
        keys: list[tuple[str, str]] = []
        target_only: list[ex.Expr] = []
        residual: list[ex.Expr] = []
        if on is not None:
            keys, target_only, residual = self.split_on(on, on_sql)
        return MergePlan(
            self.target_alias,
            self.source_alias,
            on_sql,
            on,
            tuple(keys),
            tuple(target_only),
            tuple(residual),
            unqualify(ex.conjoin(target_only)) if target_only and not by_source else None,
            tuple(matched),
            tuple(not_matched),
            tuple(by_source),
        )

    def resolve_by_source(self, spec: ClauseSpec[str]) -> MergeClause[str]:
        """A WHEN NOT MATCHED BY SOURCE clause: an update or delete whose condition and SET
        values read target columns only (there is no source row)."""
        clause = self.resolve(spec)
        used = [clause.predicate, *clause.assignments.values()]
        for expr in (e for e in used if e is not None):
            sources = sorted(
                {c.name for c in ex.referenced_columns(expr) if c.qualifier == self.source_alias}
            )
            if sources:
                raise InvalidInputError(
                    f"a WHEN NOT MATCHED BY SOURCE clause can only read target columns, not {sources}"
                )
        return clause


def check_aliases(source_alias: str, target_alias: str) -> None:
    if source_alias == target_alias:
        raise InvalidInputError("source_alias and target_alias must differ")


def begin_merge(
    builder: PlanBuilder,
    scope: MergeScope,
    on_sql: str | None,
    on: ex.Expr | None,
    matched: Sequence[MergeClause[V]],
    not_matched: Sequence[MergeClause[V]],
    by_source: Sequence[MergeClause[V]] = (),
) -> MergePlan[V]:
    """Start a MERGE on ``builder``: name the operation with its parameters, refuse
    append-only tables when rows may change, and plan it (the same steps, in the same
    order, for every executor). The executor then scans ``plan.target_predicate``."""
    require_clauses(matched, not_matched, by_source)
    builder.set_operation("MERGE", merge_parameters(on_sql, matched, not_matched, by_source))
    if matched:
        check_append_only(builder, "MERGE with WHEN MATCHED")
    if by_source:
        check_append_only(builder, "MERGE with WHEN NOT MATCHED BY SOURCE")
    return scope.plan(on_sql, on, matched, not_matched, by_source)


def unqualify(expr: ex.Expr) -> ex.Expr:
    """A target-only expression with its ``t.`` qualifiers dropped (for scans on the target)."""
    if isinstance(expr, ex.Column):
        return ex.Column(expr.name)
    if isinstance(expr, ex.Call):
        return ex.Call(expr.op, tuple(unqualify(a) for a in expr.args))
    return expr
