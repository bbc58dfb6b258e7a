"""Hostile user text: every bad input raises a typed error and leaves the table as it was.

User text enters the library as SQL (predicates, SET expressions, MERGE conditions and
values, ``replace_where``, ``partition_filter``), as names (columns, partition columns,
table name and description, property keys), as free text stored in the log (property
values, ``userMetadata``, txn app ids) and as Spark writer options. For each, the
property-based tests below generate text that mixes valid SQL with what breaks naive code:
lone surrogates (no UTF-8 encoding), NUL, quotes and backslashes, deep nesting, huge
literals and long operator chains. They assert three things a user relies on:

* only :class:`~eventlog.errors.EventlogError` subclasses escape (never ``RecursionError``,
  ``TypeError``, ``UnicodeEncodeError``, ...);
* after a failure the table's version and contents are unchanged;
* no file is left behind: the table directory (data files, deletion vectors, staged
  commits) holds exactly what it held before.

An input that is valid simply succeeds; the test then takes the new state as its baseline.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from eventlog import InvalidInputError, PredicateError, Table
from eventlog.errors import EventlogError, InvalidTextError
from eventlog.expr import parse_predicate
from eventlog.expr.nodes import tree_depth
from eventlog.userinput import MAX_EXPRESSION_DEPTH, MAX_NESTING_DEPTH

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("v", pa.float64()), ("day", pa.string())])
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def base_rows(start: int = 0) -> pa.Table:
    ids = list(range(start, start + 6))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": [f"n{i}" for i in ids],
            "v": [i / 2 for i in ids],
            "day": ["2024-01-01" if i % 2 else "2024-01-02" for i in ids],
        },
        schema=SCHEMA,
    )


# --------------------------------------------------------------------------- strategies

# Characters that break naive code: lone surrogates, NUL and control characters, quoting and
# escaping, SQL punctuation, non-ASCII digits ("²".isdigit() is true), right-to-left marks.
_NASTY = st.sampled_from(
    ["\ud800", "\udfff", "\x00", "\x7f", "\n", "'", '"', "`", "\\", "(", ")", "%", "=", "²", "٣", "\u202e"]
)
_CHAR = st.one_of(st.characters(), _NASTY, st.characters(categories=["Cs"]))
hostile_text = st.lists(_CHAR, max_size=20).map("".join)  # st.text() avoids surrogates
name_text = st.one_of(st.sampled_from(["id", "name", "v", "day", "ID", "target.id"]), hostile_text)


def _string_literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


_LEAF = st.one_of(
    st.sampled_from(["id", "name", "v", "day", "NULL", "true", "missing_col", "`id`", "DATE'2024-01-01'"]),
    st.integers(min_value=-(10**90), max_value=10**90).map(str),
    st.decimals(allow_nan=False, allow_infinity=False, places=3).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    hostile_text.map(_string_literal),
)


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    binary = st.sampled_from(["AND", "OR", "=", "<>", "<", ">=", "+", "-", "*", "/", "%", "LIKE", "||"])
    return st.one_of(
        st.tuples(children, binary, children).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
        children.map(lambda c: f"({c})"),
        children.map(lambda c: f"NOT {c}"),
        children.map(lambda c: f"{c} IS NULL"),
        st.tuples(children, children, children).map(lambda t: f"{t[0]} BETWEEN {t[1]} AND {t[2]}"),
        st.tuples(children, st.lists(children, min_size=1, max_size=4)).map(
            lambda t: f"{t[0]} IN ({', '.join(t[1])})"
        ),
        st.tuples(children, children, children).map(
            lambda t: f"CASE WHEN {t[0]} THEN {t[1]} ELSE {t[2]} END"
        ),
        st.tuples(st.sampled_from(["lower", "upper", "abs", "coalesce", "nosuchfn"]), children).map(
            lambda t: f"{t[0]}({t[1]})"
        ),
        children.map(lambda c: f"CAST({c} AS BIGINT)"),
    )


def _deep(depth: int, core: str, kind: str) -> str:
    if kind == "parens":
        return "(" * depth + core + ")" * depth
    if kind == "not":
        return "NOT " * depth + core
    if kind == "minus":
        return "- " * depth + "1 < id"
    if kind == "case":
        return "CASE WHEN true THEN " * depth + core + " END" * depth
    return " AND ".join([core] * depth)  # a long chain, accepted at any length


sql_text = st.one_of(
    st.recursive(_LEAF, _combine, max_leaves=12),
    st.tuples(
        st.integers(1, 400),
        st.sampled_from(["id > 2", "name = 'n1'"]),
        st.sampled_from(["parens", "not", "minus", "case", "chain"]),
    ).map(lambda t: _deep(*t)),
    # valid SQL with hostile text spliced in at a random place
    st.tuples(
        st.sampled_from(["id > 2 AND name <> 'x'", "v * 2 >= id"]), st.integers(0, 25), hostile_text
    ).map(lambda t: t[0][: t[1]] + t[2] + t[0][t[1] :]),
    hostile_text,
)


# --------------------------------------------------------------------------- the table under test


def _tree(root: Path) -> set[str]:
    out: set[str] = set()
    for folder, _, names in os.walk(root):
        out.update(os.path.relpath(os.path.join(folder, n), root) for n in names)
    return out


class Guarded:
    """One table; ``attempt`` runs an operation and checks the invariants of this module."""

    def __init__(self, root: Path, **create: Any) -> None:
        self.root = root
        self.table = Table.create(str(root), SCHEMA, **create)
        self.table.append(base_rows())
        self.table.append(base_rows(6))
        self._baseline()

    def _state(self) -> tuple[int, list[dict[str, Any]], set[str]]:
        fresh = Table.open(str(self.root))
        rows = fresh.to_arrow().sort_by([("id", "ascending"), ("name", "ascending")]).to_pylist()
        return fresh.version, rows, _tree(self.root)

    def _baseline(self) -> None:
        self.before = self._state()

    def attempt(self, operation: Callable[[Table], object]) -> EventlogError | None:
        try:
            operation(self.table)
        except EventlogError as exc:
            version, rows, files = self._state()
            assert version == self.before[0], f"a failed operation moved the table: {exc!r}"
            assert rows == self.before[1], f"a failed operation changed rows: {exc!r}"
            assert files == self.before[2], f"a failed operation left files: {files ^ self.before[2]}"
            assert str(exc), "errors name the problem"
            return exc
        # Valid input: the operation committed (or was a no-op); refill an emptied table.
        if self.table.refresh() is not None and self.table.to_arrow(columns=["id"]).num_rows == 0:
            self.table.append(base_rows())
        self._baseline()
        return None


@pytest.fixture(params=["rewrite", "deletion-vectors"])
def guarded(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Guarded]:
    props = {"delta.enableDeletionVectors": "true"} if request.param == "deletion-vectors" else {}
    yield Guarded(tmp_path / "t", properties=props, partition_by=["day"])


# --------------------------------------------------------------------------- the reported defects


def test_deeply_nested_predicate_is_a_typed_error_and_changes_nothing(guarded: Guarded) -> None:
    err = guarded.attempt(lambda t: t.delete("(" * 120 + "id > 1" + ")" * 120))
    assert isinstance(err, PredicateError) and isinstance(err, InvalidInputError)
    assert err.expression.startswith("((((")
    assert "nested 120 levels" in str(err)


def test_lone_surrogate_literal_is_a_typed_error_and_changes_nothing(guarded: Guarded) -> None:
    err = guarded.attempt(lambda t: t.delete("name = '\ud800'"))
    assert isinstance(err, PredicateError) and err.expression == "name = '\ud800'"
    for bad in (
        lambda t: t.overwrite(base_rows(), replace_where="day = '\ud800'"),
        lambda t: t.optimize(partition_filter="day = '\ud800'"),
        lambda t: t.update("name = '\udfff'", {"v": "1"}),
    ):
        assert isinstance(guarded.attempt(bad), PredicateError)  # SQL text: always PredicateError
    err = guarded.attempt(lambda t: t.update("id = 1", {"name": "'\udfff'"}))
    assert isinstance(err, PredicateError)


def test_text_errors_carry_argument_reason_and_position(guarded: Guarded) -> None:
    err = guarded.attempt(lambda t: t.set_properties({"owner": "ab\ud800"}))
    assert isinstance(err, InvalidTextError)
    assert (err.argument, err.position) == ("table property 'owner' value", 2)
    assert "surrogate" in err.reason
    err = guarded.attempt(lambda t: t.set_properties({"": "x"}))
    assert isinstance(err, InvalidTextError) and (err.argument, err.reason) == ("table property key", "empty")
    err = guarded.attempt(lambda t: t.append(base_rows(50), user_metadata="\udc00"))
    assert isinstance(err, InvalidTextError) and err.argument == "userMetadata"
    err = guarded.attempt(lambda t: t.append(base_rows(50), txn_app_id="", txn_version=1))
    assert isinstance(err, InvalidTextError) and err.argument == "txn app id"


def test_long_and_or_chains_are_accepted_and_evaluated(guarded: Guarded) -> None:
    """Thousands of conjuncts are fine: chains are balanced, not nested thousands deep."""
    pred = " OR ".join(f"id = {i}" for i in range(3, 3000))
    assert tree_depth(parse_predicate(pred, SCHEMA)) < 40  # log2(3000 / 16) + 16 + leaves
    assert guarded.attempt(lambda t: t.delete(pred)) is None
    assert sorted(guarded.table.to_arrow().column("id").to_pylist()) == [0, 1, 2]


def test_nesting_limits_are_exact() -> None:
    assert parse_predicate("(" * MAX_NESTING_DEPTH + "id > 1" + ")" * MAX_NESTING_DEPTH, SCHEMA)
    with pytest.raises(PredicateError, match="MAX_NESTING_DEPTH"):
        parse_predicate("(" * (MAX_NESTING_DEPTH + 1) + "id > 1" + ")" * (MAX_NESTING_DEPTH + 1), SCHEMA)
    long_sum = " + ".join(["id"] * (MAX_EXPRESSION_DEPTH + 5)) + " > 1"
    with pytest.raises(PredicateError):
        parse_predicate(long_sum, SCHEMA)


def test_nul_is_allowed_in_values_but_not_in_paths(tmp_path: Path) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA, properties={"comment": "a\x00b"})
    t.append(base_rows(), user_metadata="x\x00y")
    assert Table.open(str(tmp_path / "t")).properties["comment"] == "a\x00b"
    assert t.history(1)[0]["userMetadata"] == "x\x00y"
    with pytest.raises(InvalidTextError) as info:
        Table.create(str(tmp_path / "a\x00b"), SCHEMA)
    assert (info.value.argument, info.value.position) == ("table URI", len(str(tmp_path)) + 2)
    assert not (tmp_path / "a").exists()


# --------------------------------------------------------------------------- property-based


@FUZZ
@given(pred=sql_text)
def test_fuzz_delete_predicates(guarded: Guarded, pred: str) -> None:
    guarded.attempt(lambda t: t.delete(pred))


@FUZZ
@given(pred=sql_text, column=name_text, value=sql_text)
def test_fuzz_update(guarded: Guarded, pred: str, column: str, value: str) -> None:
    guarded.attempt(lambda t: t.update(pred, {column: value}))


@FUZZ
@given(on=sql_text, cond=st.one_of(st.none(), sql_text), column=name_text, value=sql_text)
def test_fuzz_merge(guarded: Guarded, on: str, cond: str | None, column: str, value: str) -> None:
    source = base_rows(4).set_column(1, "name", pa.array(["m"] * 6))
    guarded.attempt(
        lambda t: (
            t.merge(source, "target.id = source.id AND " + on)
            .when_matched_update(cond, set={column: value})
            .when_not_matched_insert_all(cond)
            .execute()
        )
    )
    guarded.attempt(
        lambda t: (
            t.merge(source, on)
            .when_matched_delete(cond)
            .when_not_matched_insert(values={column: value})
            .execute()
        )
    )


@FUZZ
@given(where=sql_text, filt=sql_text)
def test_fuzz_overwrite_optimize_and_reads(guarded: Guarded, where: str, filt: str) -> None:
    guarded.attempt(lambda t: t.overwrite(base_rows(100), replace_where=where))
    guarded.attempt(lambda t: t.optimize(partition_filter=where))
    guarded.attempt(lambda t: t.to_arrow(filter=filt))


@FUZZ
@given(
    properties=st.dictionaries(
        st.one_of(
            hostile_text, st.sampled_from(["delta.appendOnly", "delta.logRetentionDuration", "delta.x"])
        ),
        st.one_of(hostile_text, st.sampled_from(["true", "interval 2 days", "²", "1" * 40])),
        max_size=3,
    ),
    keys=st.lists(hostile_text, max_size=3),
)
def test_fuzz_properties(guarded: Guarded, properties: dict[str, str], keys: list[str]) -> None:
    guarded.attempt(lambda t: t.set_properties(properties))
    guarded.attempt(lambda t: t.unset_properties(keys))


@FUZZ
@given(
    user_metadata=st.one_of(st.none(), hostile_text),
    app_id=st.one_of(st.none(), hostile_text),
    version=st.integers(-3, 5),
)
def test_fuzz_write_metadata(
    guarded: Guarded, user_metadata: str | None, app_id: str | None, version: int
) -> None:
    guarded.attempt(
        lambda t: t.append(
            base_rows(200),
            user_metadata=user_metadata,
            txn_app_id=app_id,
            txn_version=None if app_id is None else version,
        )
    )


@FUZZ
@given(
    columns=st.lists(name_text, min_size=1, max_size=3),
    partition=st.lists(name_text, max_size=2),
    name=st.one_of(st.none(), hostile_text),
    description=st.one_of(st.none(), hostile_text),
    nesting=st.integers(0, 90),
)
def test_fuzz_create(
    tmp_path: Path,
    columns: list[str],
    partition: list[str],
    name: str | None,
    description: str | None,
    nesting: int,
) -> None:
    """Creating with hostile names: a typed error and no table, or a table that reopens."""
    try:
        fields = [pa.field(c, pa.int64()) for c in columns]
        nested: pa.DataType = pa.int64()
        for _ in range(nesting):
            nested = pa.struct([pa.field("f", nested)])
        schema = pa.schema([*fields, pa.field("deep", nested)])
    except (UnicodeEncodeError, pa.ArrowException):
        return  # pyarrow itself refuses such names; nothing of ours was called
    root = tmp_path / uuid.uuid4().hex  # examples share tmp_path
    try:
        Table.create(str(root), schema, partition_by=partition, name=name, description=description)
    except EventlogError:
        assert not (root / "_delta_log").exists() or not any((root / "_delta_log").iterdir())
        return
    reopened = Table.open(str(root))
    assert reopened.schema.names == schema.names
    assert reopened.partition_columns == tuple(partition)


@FUZZ
@given(
    options=st.dictionaries(
        st.sampled_from(
            [
                "txnAppId",
                "txnVersion",
                "userMetadata",
                "replaceWhere",
                "mergeSchema",
                "partitionBy",
                "groupCommit",
            ]
        ),
        st.one_of(hostile_text, st.sampled_from(["true", "1", "-1", "id > 1", "٣", "1" * 5000])),
        max_size=4,
    )
)
def test_fuzz_spark_writer_options(tmp_path: Path, options: dict[str, str]) -> None:
    """The Spark writer validates its options on the driver, before any task runs."""
    pytest.importorskip("pyspark")
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from spark_adapter.writer import plan_write

    uri = str(tmp_path / "spark")
    if not Table.exists(uri):
        Table.create(uri, pa.schema([("id", pa.int64()), ("name", pa.string())]))
    spark_schema = StructType([StructField("id", LongType()), StructField("name", StringType())])
    for overwrite in (False, True):
        try:
            plan = plan_write({"path": uri, **options}, spark_schema, overwrite)
        except EventlogError:
            continue
        assert (plan.uri, plan.overwrite) == (uri, overwrite)
    assert Table.open(uri).version == 0


def test_strategies_reach_the_hostile_cases() -> None:
    """The fuzzers above are only as good as their inputs: check they produce the classes of
    text that broke the library before (lone surrogates, deep nesting)."""
    search = settings(max_examples=300, database=None)
    assert find(sql_text, lambda t: any("\ud800" <= ch <= "\udfff" for ch in t), settings=search)
    assert find(sql_text, lambda t: t.count("(") > MAX_NESTING_DEPTH, settings=search)
    assert find(sql_text, lambda t: " OR " in t or " AND " in t, settings=search)
    assert find(sql_text, lambda t: "CASE WHEN" in t, settings=search)


def test_filters_pyarrow_cannot_evaluate_are_predicate_errors(guarded: Guarded) -> None:
    """A failed cast inside a pushed-down filter, and filters too large for pyarrow's
    scanner (10,000 terms crash pyarrow 26), still give typed errors or correct rows."""
    err = guarded.attempt(lambda t: t.to_arrow(filter="NOT (CAST(name AS BIGINT) IS NULL)"))
    assert isinstance(err, PredicateError) and err.expression == "NOT (CAST(name AS BIGINT) IS NULL)"
    huge = " OR ".join(f"id = {i}" for i in range(3, 10_003))
    got = guarded.table.to_arrow(filter=huge, columns=["name"])
    assert got.schema.names == ["name"]
    assert sorted(got.column("name").to_pylist()) == sorted(f"n{i}" for i in range(3, 12))
