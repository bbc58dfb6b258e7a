"""Expression trees back to canonical Spark SQL text (:func:`to_sql`): identifiers are
quoted only when needed, literals are spelled so that they parse back to the same typed
literal (with a CAST where the parser would infer another type), and operands are
parenthesised by precedence, so that ``parse_predicate(to_sql(e), schema) == e``.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from decimal import Decimal
from typing import Any

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from eventlog.errors import PredicateError
from eventlog.expr.literals import _number_literal
from eventlog.expr.nodes import _COMPARISONS, Call, Column, Expr, Literal, _cast_target
from eventlog.expr.types import _BOOL, _F64, _UTC, _type_sql


def _bare_literal(v: Any) -> tuple[str, pa.DataType]:
    """SQL text for a value, and the type the parser gives that text."""
    if isinstance(v, bool):
        return ("TRUE" if v else "FALSE"), _BOOL
    if isinstance(v, (int, Decimal)):
        text = str(v) if isinstance(v, int) else format(v, "f")
        return text, _number_literal(text).type
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            name = "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
            return f"CAST('{name}' AS DOUBLE)", _F64
        text = repr(v)
        return (text if "e" in text else text + "E0"), _F64
    if isinstance(v, str):
        return exp.Literal.string(v).sql(dialect="spark"), pa.string()
    if isinstance(v, bytes):
        return f"X'{v.hex().upper()}'", pa.binary()
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:
            wall = v.astimezone(_UTC).replace(tzinfo=None).isoformat(sep=" ")
            return f"TIMESTAMP '{wall}'", pa.timestamp("us", "UTC")
        return f"TIMESTAMP_NTZ '{v.isoformat(sep=' ')}'", pa.timestamp("us")
    if isinstance(v, dt.date):
        return f"DATE '{v.isoformat()}'", pa.date32()
    raise TypeError(f"unsupported literal value {v!r}")


# --------------------------------------------------------------------------- SQL rendering

_SYMBOLS = {
    "or": "OR",
    "and": "AND",
    "eq": "=",
    "ne": "<>",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "eq_null_safe": "<=>",
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "mod": "%",
}
_PRECEDENCE = {"or": 1, "and": 2, "not": 3, "add": 5, "sub": 5, "mul": 6, "div": 6, "mod": 6, "neg": 7}
_PREDICATES = frozenset({*_COMPARISONS, "is_null", "is_not_null", "in", "like"})
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _precedence(e: Expr) -> int:
    if isinstance(e, Call):
        return 4 if e.op in _PREDICATES else _PRECEDENCE.get(e.op, 9)
    if isinstance(e, Literal) and isinstance(e.value, (int, float, Decimal)) and e.value < 0:
        return 7  # rendered with a leading minus
    return 9


def _operand(e: Expr, parent: int, *, tight: bool) -> str:
    # Predicates (=, IN, LIKE, IS NULL...) do not chain: parenthesise equal precedence too.
    p = _precedence(e)
    return f"({to_sql(e)})" if p < parent or (tight and p == parent) else to_sql(e)


@functools.lru_cache(maxsize=4096)
def _identifier_sql(name: str) -> str:
    if _IDENTIFIER.fullmatch(name):
        try:
            parsed = sqlglot.parse_one(name, dialect="spark")
        except SqlglotError:
            parsed = None
        # keywords and niladic functions (CURRENT_DATE...) would not read back as a column
        if isinstance(parsed, exp.Column) and parsed.name == name and not parsed.table:
            return name
    return "`" + name.replace("`", "``") + "`"


def _literal_sql(lit: Literal) -> str:
    if lit.value is None:
        return (
            "NULL"
            if lit.type is None or pa.types.is_null(lit.type)
            else f"CAST(NULL AS {_type_sql(lit.type)})"
        )
    text, natural = _bare_literal(lit.value)
    return text if natural == lit.type else f"CAST({text} AS {_type_sql(lit.type)})"


def to_sql(expr: Expr) -> str:
    """Canonical Spark SQL text; ``parse_predicate(to_sql(e), schema) == e`` for parsed ``e``."""
    if isinstance(expr, Column):
        path = ".".join(_identifier_sql(p) for p in expr.name.split("."))
        return path if expr.qualifier is None else f"{_identifier_sql(expr.qualifier)}.{path}"
    if isinstance(expr, Literal):
        return _literal_sql(expr)
    op, args = expr.op, expr.args
    if op in _SYMBOLS:
        p = _precedence(expr)
        left = _operand(args[0], p, tight=p == 4)
        return f"{left} {_SYMBOLS[op]} {_operand(args[1], p, tight=True)}"
    if op == "not":
        inner = to_sql(args[0])
        return f"NOT {inner}" if _precedence(args[0]) == 9 else f"NOT ({inner})"
    if op == "neg":
        return f"-{to_sql(args[0])}" if isinstance(args[0], Column) else f"-({to_sql(args[0])})"
    if op in ("is_null", "is_not_null"):
        return f"{_operand(args[0], 4, tight=True)} IS {'NOT ' if op == 'is_not_null' else ''}NULL"
    if op == "in":
        return f"{_operand(args[0], 4, tight=True)} IN ({', '.join(to_sql(a) for a in args[1:])})"
    if op == "like":
        return f"{_operand(args[0], 4, tight=True)} LIKE {to_sql(args[1])}"
    if op == "cast":
        return f"CAST({to_sql(args[0])} AS {_type_sql(_cast_target(expr))})"
    if op in ("coalesce", "lower", "upper", "abs", "length", "year", "month", "day", "hour"):
        return f"{op.upper()}({', '.join(to_sql(a) for a in args)})"
    raise PredicateError(f"unknown operator {op!r}", expression=repr(expr))
