"""SQL predicates and expressions in one small internal form.

Users write predicates and SET expressions as Spark SQL strings. They are parsed once (sqlglot,
dialect ``spark``), with column names resolved against the table schema, into a tree of three
frozen node types (:class:`Column`, :class:`Literal`, :class:`Call`) that is then evaluated on
rows or on typed partition values (:func:`evaluate`, :func:`evaluate_mask`), turned into a
``pyarrow.dataset`` filter (:func:`to_arrow`) or checked against per-file statistics
(:func:`may_match`, implemented in :mod:`eventlog.expr.skipping`).

``Call.op`` is one of: and or not eq ne lt le gt ge eq_null_safe is_null is_not_null in like
add sub mul div mod neg cast coalesce lower upper abs length year month day hour
(``to_date(x)`` is ``cast`` to DATE). ``in`` takes the value then the list
items; ``like`` the value then a string Literal; ``cast`` the operand then
``Literal(None, target_type)``. BETWEEN becomes ``ge AND le``, ``x IS TRUE`` becomes
``x <=> TRUE``, NOT LIKE / NOT IN / NOT BETWEEN / IS DISTINCT FROM become ``not(...)``.
Casts and unary minus of literals are folded into typed literals, which is what makes
``to_sql`` round-trip exactly.

Semantics follow Spark SQL: three-valued logic; ``/`` yields DOUBLE (DECIMAL for decimals);
``/`` and ``%`` by zero yield NULL; integer overflow and failed casts are errors
(:class:`PredicateError`); string literals compared with typed values are converted to that
type while parsing; naive timestamp strings mean UTC.

This module is the public facade; the implementation lives in :mod:`eventlog.expr.nodes`
(the tree and tree utilities), :mod:`eventlog.expr.parse` (parsing; literals are typed by
:mod:`eventlog.expr.literals`), :mod:`eventlog.expr.render`
(:func:`to_sql`), :mod:`eventlog.expr.evaluate` (evaluation and Arrow filters) and
:mod:`eventlog.expr.skipping` (data skipping), with shared type helpers in :mod:`eventlog.expr.types`.
"""

from __future__ import annotations

from eventlog.expr.evaluate import evaluate, evaluate_mask, to_arrow
from eventlog.expr.nodes import (
    TRUE,
    Call,
    Column,
    Expr,
    Literal,
    conjoin,
    conjuncts,
    partition_predicate,
    referenced_columns,
    tree_size,
)
from eventlog.expr.parse import check_sql_text, parse_expression, parse_predicate
from eventlog.expr.render import to_sql
from eventlog.expr.skipping import may_match, may_match_mask

__all__ = [
    "check_sql_text",
    "TRUE",
    "Call",
    "Column",
    "Expr",
    "Literal",
    "conjoin",
    "conjuncts",
    "evaluate",
    "evaluate_mask",
    "may_match",
    "may_match_mask",
    "parse_expression",
    "parse_predicate",
    "partition_predicate",
    "referenced_columns",
    "to_arrow",
    "to_sql",
    "tree_size",
]
