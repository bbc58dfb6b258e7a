"""SQL predicates and expressions in one small internal form.

Users write predicates and SET expressions as Spark SQL strings. They are parsed once (sqlglot,
dialect ``spark``), with column names resolved against the table schema, into a tree of three
frozen node types (:class:`Column`, :class:`Literal`, :class:`Call`) that is then evaluated on
rows or on typed partition values (:func:`evaluate`, :func:`evaluate_mask`), turned into a
``pyarrow.dataset`` filter (:func:`to_arrow`) or checked against per-file statistics
(:func:`may_match`, implemented in :mod:`eventlog.skipping`).

``Call.op`` is one of: and or not eq ne lt le gt ge eq_null_safe is_null is_not_null in like
add sub mul div mod neg cast coalesce lower upper abs. ``in`` takes the value then the list
items; ``like`` the value then a string Literal; ``cast`` the operand then
``Literal(None, target_type)``. BETWEEN becomes ``ge AND le``, ``x IS TRUE`` becomes
``x <=> TRUE``, NOT LIKE / NOT IN / NOT BETWEEN / IS DISTINCT FROM become ``not(...)``.
Casts and unary minus of literals are folded into typed literals, which is what makes
``to_sql`` round-trip exactly.

Semantics follow Spark SQL: three-valued logic; ``/`` yields DOUBLE (DECIMAL for decimals);
``/`` and ``%`` by zero yield NULL; integer overflow and failed casts are errors
(:class:`PredicateError`); string literals compared with typed values are converted to that
type while parsing; naive timestamp strings mean UTC.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import Any, NoReturn, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from eventlog.errors import PredicateError, UnknownColumnError

# --------------------------------------------------------------------------- nodes


@dataclass(frozen=True, slots=True)
class Column:
    """A column resolved to the schema's exact name (dotted for struct fields, ``"s.x"``).

    ``qualifier`` is the MERGE alias (``"t"``/``"s"``) the column was resolved in, else None.
    """

    name: str
    qualifier: str | None = None


@dataclass(frozen=True, slots=True)
class Literal:
    """A constant: None, bool, int, float, Decimal, str, bytes, date or datetime.

    A ``type`` of None is replaced by the value's natural Arrow type on construction, so that
    ``Literal(True) == Literal(True, pa.bool_())``. NULL keeps ``type=None`` unless typed.
    """

    value: Any
    type: pa.DataType | None = None

    def __post_init__(self) -> None:
        if self.type is None and self.value is not None:
            object.__setattr__(self, "type", _natural_type(self.value))


@dataclass(frozen=True, slots=True)
class Call:
    """An operator or function applied to arguments; see the module docstring for ``op``."""

    op: str
    args: tuple[Expr, ...]


Expr: TypeAlias = Column | Literal | Call

_BOOL = pa.bool_()
_F64 = pa.float64()
_UTC = dt.UTC
_WIDE = Context(prec=100)  # decimal arithmetic on up to 76 digits without silent rounding
_COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge", "eq_null_safe")
_ARITHMETIC = ("add", "sub", "mul", "div", "mod")

# --------------------------------------------------------------------------- types


def _decimal_type(d: Decimal) -> pa.DataType:
    _, digits, exponent = d.as_tuple()
    if not isinstance(exponent, int):
        raise ValueError(f"{d} is not a finite decimal")
    scale = max(0, -exponent)
    precision = max(len(digits) + max(0, exponent), scale, 1)
    return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)


def _natural_type(value: Any) -> pa.DataType:
    if isinstance(value, bool):
        return _BOOL
    if isinstance(value, int):
        return pa.int64() if -(2**63) <= value < 2**63 else _decimal_type(Decimal(value))
    if isinstance(value, float):
        return _F64
    if isinstance(value, Decimal):
        return _decimal_type(value)
    if isinstance(value, str):
        return pa.string()
    if isinstance(value, bytes):
        return pa.binary()
    if isinstance(value, dt.datetime):  # before date: datetime is a date subclass
        return pa.timestamp("us", "UTC" if value.tzinfo is not None else None)
    if isinstance(value, dt.date):
        return pa.date32()
    raise TypeError(f"unsupported literal value {value!r}")


TRUE: Expr = Literal(True)


def _kind(t: pa.DataType | None) -> str:
    """Coarse type family used for type checking and coercion."""
    if t is None or pa.types.is_null(t):
        return "null"
    for kind, test in _KINDS:
        if test(t):
            return kind
    return "other"


_KINDS: tuple[tuple[str, Callable[[pa.DataType], bool]], ...] = (
    ("bool", pa.types.is_boolean),
    ("int", pa.types.is_integer),
    ("float", pa.types.is_floating),
    ("decimal", pa.types.is_decimal),
    ("string", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t) or t == pa.string_view()),
    (
        "binary",
        lambda t: (
            pa.types.is_binary(t)
            or pa.types.is_large_binary(t)
            or pa.types.is_fixed_size_binary(t)
            or t == pa.binary_view()
        ),
    ),
    ("date", pa.types.is_date),
    ("timestamp", pa.types.is_timestamp),
)
_NUMERIC = frozenset({"int", "float", "decimal"})
_UNITS = {"s": 0, "ms": 1, "us": 2, "ns": 3}


def _canonical(t: pa.DataType) -> pa.DataType:
    """The SQL-expressible type closest to ``t`` (literals always carry one of these)."""
    kind = _kind(t)
    if kind == "int" and pa.types.is_unsigned_integer(t):
        return pa.int64() if t.bit_width < 64 else pa.decimal128(20, 0)
    if kind == "float":
        return pa.float32() if t.bit_width <= 32 else _F64
    if kind == "decimal" and t.precision <= 38:
        return pa.decimal128(t.precision, t.scale)
    simple = {"date": pa.date32(), "string": pa.string(), "binary": pa.binary()}
    if kind in simple:
        return simple[kind]
    if kind == "timestamp":
        return pa.timestamp("us", "UTC" if t.tz else None)
    return t


def _as_decimal(t: pa.DataType) -> pa.DataType:
    if pa.types.is_decimal(t):
        return t
    digits = {8: 3, 16: 5, 32: 10, 64: 20 if pa.types.is_unsigned_integer(t) else 19}[t.bit_width]
    return pa.decimal128(digits, 0)


def _common_type(a: pa.DataType | None, b: pa.DataType | None) -> pa.DataType | None:
    """The type both sides are cast to for a comparison, arithmetic or COALESCE (None: none)."""
    ka, kb = _kind(a), _kind(b)
    if ka == "null" or a == b:
        return b if ka == "null" else a
    if kb == "null":
        return a
    kinds = {ka, kb}
    if kinds == {"int"}:
        return pa.int64()
    if kinds <= _NUMERIC and "float" in kinds:
        return _F64
    if kinds <= {"int", "decimal"}:
        da, db = _as_decimal(a), _as_decimal(b)
        scale = max(da.scale, db.scale)
        precision = max(da.precision - da.scale, db.precision - db.scale) + scale
        if precision > 76:
            return _F64
        return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
    if kinds <= {"date", "timestamp"}:
        stamps: list[Any] = [t for t in (a, b) if pa.types.is_timestamp(t)]
        unit = max((t.unit for t in stamps), key=_UNITS.__getitem__)
        return pa.timestamp(unit, next((t.tz for t in stamps if t.tz), None))
    if kinds in ({"string"}, {"binary"}):
        return pa.large_string() if ka == "string" else pa.large_binary()
    return None


def _comparable(a: pa.DataType | None, b: pa.DataType | None) -> bool:
    if "null" in (_kind(a), _kind(b)):
        return True
    if "other" in (_kind(a), _kind(b)):
        return a == b and _kind(a) != "other"
    return _common_type(a, b) is not None


_SQL_TYPES: dict[Any, pa.DataType] = {
    exp.DataType.Type.BOOLEAN: _BOOL,
    exp.DataType.Type.TINYINT: pa.int8(),
    exp.DataType.Type.SMALLINT: pa.int16(),
    exp.DataType.Type.INT: pa.int32(),
    exp.DataType.Type.BIGINT: pa.int64(),
    exp.DataType.Type.FLOAT: pa.float32(),
    exp.DataType.Type.DOUBLE: _F64,
    exp.DataType.Type.TEXT: pa.string(),
    exp.DataType.Type.VARCHAR: pa.string(),
    exp.DataType.Type.CHAR: pa.string(),
    exp.DataType.Type.BINARY: pa.binary(),
    exp.DataType.Type.VARBINARY: pa.binary(),
    exp.DataType.Type.DATE: pa.date32(),
    # Spark's TIMESTAMP is a UTC instant (TIMESTAMP_LTZ); only TIMESTAMP_NTZ is naive.
    exp.DataType.Type.TIMESTAMP: pa.timestamp("us", "UTC"),
    exp.DataType.Type.TIMESTAMPTZ: pa.timestamp("us", "UTC"),
    exp.DataType.Type.TIMESTAMPLTZ: pa.timestamp("us", "UTC"),
    exp.DataType.Type.TIMESTAMPNTZ: pa.timestamp("us"),
}
_TYPE_NAMES = {
    _BOOL: "BOOLEAN",
    pa.int8(): "TINYINT",
    pa.int16(): "SMALLINT",
    pa.int32(): "INT",
    pa.int64(): "BIGINT",
    pa.float32(): "FLOAT",
    _F64: "DOUBLE",
    pa.string(): "STRING",
    pa.binary(): "BINARY",
    pa.date32(): "DATE",
    pa.timestamp("us", "UTC"): "TIMESTAMP",
    pa.timestamp("us"): "TIMESTAMP_NTZ",
}


def _type_sql(t: pa.DataType) -> str:
    c = _canonical(t)
    if pa.types.is_decimal(c):
        return f"DECIMAL({c.precision},{c.scale})"
    if c in _TYPE_NAMES:
        return _TYPE_NAMES[c]
    raise PredicateError(f"type {t} has no SQL spelling", expression=str(t))


# --------------------------------------------------------------------------- literals


def _number_literal(text: str) -> Literal:
    """Spark's typing of a numeric literal: 1 -> BIGINT, 1.50 -> DECIMAL(3,2), 1e3 -> DOUBLE."""
    if "e" in text or "E" in text:
        return Literal(float(text), _F64)
    if "." in text:
        return Literal(Decimal(text))
    return Literal(int(text))


def _coerce_string(text: str, target: pa.DataType, *, exact: bool) -> Literal:
    """Convert a string literal to ``target``; ValueError if it does not denote such a value.

    ``exact`` (comparisons): a decimal with more digits than the target keeps its own type
    instead of being rounded, so ``price = '1.005'`` stays false for 1.00 and 1.01.
    """
    target = _canonical(target)
    kind, s = _kind(target), text.strip()
    if kind == "string":
        return Literal(text, target)
    try:
        if kind == "int":
            return Literal(pa.scalar(int(s), target).as_py(), target)
        if kind == "float":
            return Literal(pa.scalar(float(s), target).as_py(), target)
        if kind == "decimal":
            d = Decimal(s)
            if not d.is_finite():
                raise ValueError("not a finite number")
            q = d.quantize(Decimal((0, (1,), -target.scale)), rounding=ROUND_HALF_UP, context=_WIDE)
            if (exact and q != d) or _decimal_type(q).precision > target.precision:
                if exact:  # keep the literal exact: 1.005 equals no DECIMAL(10,2) value
                    return Literal(d)
                raise ValueError("out of range")
            return Literal(q, target)
        if kind == "bool":
            word = s.lower()
            if word in ("t", "true", "y", "yes", "1", "f", "false", "n", "no", "0"):
                return Literal(word in ("t", "true", "y", "yes", "1"), target)
        if kind == "date":
            return Literal(dt.date.fromisoformat(s), target)
        if kind == "timestamp":
            v = dt.datetime.fromisoformat(s)
            if target.tz:
                v = v.replace(tzinfo=_UTC) if v.tzinfo is None else v.astimezone(_UTC)
            elif v.tzinfo is not None:
                raise ValueError("a zone offset cannot be compared with TIMESTAMP_NTZ")
            return Literal(v, target)
        if kind == "binary":
            return Literal(text.encode(), target)
    except (ValueError, ArithmeticError, InvalidOperation, pa.ArrowException) as e:
        raise ValueError(f"cannot convert {text!r} to {_type_sql(target)}: {e}") from e
    raise ValueError(f"cannot convert {text!r} to {_type_sql(target) if kind != 'other' else target}")


def _fold_cast(lit: Literal, target: pa.DataType) -> Literal:
    """CAST(literal AS type) evaluated at parse time (ValueError if it fails)."""
    if lit.value is None:
        return Literal(None, target)
    if isinstance(lit.value, str):
        return _coerce_string(lit.value, target, exact=False)
    if pa.types.is_decimal(target) and isinstance(lit.value, (int, float, Decimal)) and lit.value is not True:
        return _coerce_string(str(lit.value), target, exact=False)
    try:
        return Literal(pa.scalar(lit.value, lit.type).cast(target).as_py(), target)
    except pa.ArrowException as e:
        raise ValueError(f"cannot cast {lit.value!r} to {_type_sql(target)}: {e}") from e


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


# --------------------------------------------------------------------------- parsing

_Typed: TypeAlias = tuple[Expr, pa.DataType | None]
_CMP_NODES: dict[type[exp.Expression], str] = {
    exp.EQ: "eq",
    exp.NEQ: "ne",
    exp.LT: "lt",
    exp.LTE: "le",
    exp.GT: "gt",
    exp.GTE: "ge",
    exp.NullSafeEQ: "eq_null_safe",
}
_ARITH_NODES: dict[type[exp.Expression], str] = {
    exp.Add: "add",
    exp.Sub: "sub",
    exp.Mul: "mul",
    exp.Div: "div",
    exp.Mod: "mod",
}
_STRING_FUNCS: dict[type[exp.Expression], str] = {exp.Lower: "lower", exp.Upper: "upper"}


class _Parser:
    def __init__(
        self, sql: str, schema: pa.Schema, qualifiers: Mapping[str, pa.Schema] | None, context: str
    ) -> None:
        self.sql, self.schema, self.qualifiers, self.context = sql, schema, qualifiers, context

    def fail(self, message: str) -> NoReturn:
        raise PredicateError(f"{message} in {self.context} {self.sql!r}", expression=self.sql)

    def parse(self) -> _Typed:
        if not isinstance(self.sql, str):
            raise PredicateError(f"{self.context} must be a SQL string", expression=repr(self.sql))
        try:
            trees = [tree for tree in sqlglot.parse(self.sql, dialect="spark") if tree is not None]
        except SqlglotError as e:
            self.fail(f"cannot parse ({str(e).splitlines()[0]})")
        if len(trees) != 1 or not isinstance(trees[0], exp.Expression):
            self.fail("expected exactly one expression")
        return self.node(trees[0])

    def node(self, n: exp.Expression) -> _Typed:
        if isinstance(n, exp.Paren):
            return self.node(n.this)
        if isinstance(n, (exp.And, exp.Or)):
            op = "and" if isinstance(n, exp.And) else "or"
            return Call(op, (self.boolean(n.this), self.boolean(n.expression))), _BOOL
        if isinstance(n, exp.Not):
            if isinstance(n.this, exp.Is) and isinstance(n.this.expression, exp.Null):
                return Call("is_not_null", (self.node(n.this.this)[0],)), _BOOL
            return Call("not", (self.boolean(n.this),)), _BOOL
        if type(n) in _CMP_NODES:
            return self.compare(_CMP_NODES[type(n)], n.this, n.expression), _BOOL
        if isinstance(n, exp.NullSafeNEQ):  # a IS DISTINCT FROM b
            return Call("not", (self.compare("eq_null_safe", n.this, n.expression),)), _BOOL
        if isinstance(n, exp.Is):
            if isinstance(n.expression, exp.Null):
                return Call("is_null", (self.node(n.this)[0],)), _BOOL
            if isinstance(n.expression, exp.Boolean):
                return Call("eq_null_safe", (self.boolean(n.this), Literal(bool(n.expression.this)))), _BOOL
        if isinstance(n, exp.In) and not any(n.args.get(k) for k in ("query", "unnest", "field")):
            return self.in_list(n), _BOOL
        if isinstance(n, exp.Between):
            lo, hi = n.args["low"], n.args["high"]
            call = Call("and", (self.compare("ge", n.this, lo), self.compare("le", n.this, hi)))
            if n.args.get("symmetric"):
                flipped = Call("and", (self.compare("ge", n.this, hi), self.compare("le", n.this, lo)))
                call = Call("or", (call, flipped))
            return call, _BOOL
        if isinstance(n, exp.Like):
            return self.like(n), _BOOL
        if type(n) in _ARITH_NODES:
            return self.arithmetic(_ARITH_NODES[type(n)], n.this, n.expression)
        if isinstance(n, exp.Neg):
            if isinstance(n.this, exp.Literal) and not n.this.is_string:
                lit = _number_literal("-" + n.this.this)  # fold, so -9223372036854775808 is a BIGINT
                return lit, lit.type
            arg, t = self.numeric(n.this, "unary minus")
            return Call("neg", (arg,)), t
        if isinstance(n, exp.Cast):  # includes TryCast: sqlglot reads Spark's CAST as TRY_CAST
            return self.cast(n)
        if isinstance(n, exp.Coalesce):
            return self.coalesce([n.this, *n.expressions])
        if type(n) in _STRING_FUNCS:
            arg, t = self.node(n.this)
            if _kind(t) not in ("string", "null"):
                self.fail(f"{type(n).__name__.upper()} needs a string argument, got {t}")
            return Call(_STRING_FUNCS[type(n)], (arg,)), pa.string()
        if isinstance(n, exp.Abs):
            arg, t = self.numeric(n.this, "ABS")
            return Call("abs", (arg,)), t
        return self.leaf(n)

    def leaf(self, n: exp.Expression) -> _Typed:
        if isinstance(n, exp.Literal):
            lit = Literal(n.this, pa.string()) if n.is_string else _number_literal(n.this)
            return lit, lit.type
        if isinstance(n, exp.Boolean):
            return Literal(bool(n.this)), _BOOL
        if isinstance(n, exp.Null):
            return Literal(None), None
        if isinstance(n, exp.HexString):
            try:
                return Literal(bytes.fromhex(n.this)), pa.binary()
            except ValueError:
                self.fail(f"invalid hex literal X'{n.this}'")
        parts = _column_parts(n)
        if parts is not None:
            return self.column(parts)
        self.unsupported(n)

    def unsupported(self, n: exp.Expression) -> NoReturn:
        if isinstance(n, (exp.Query, exp.Subquery, exp.SubqueryPredicate)) or n.find(exp.Query):
            what = "subquery"
        elif isinstance(n, exp.Window):
            what = "window function"
        elif isinstance(n, exp.Func):
            name = n.name.upper() if isinstance(n, exp.Anonymous) else n.sql_name()
            what = f"{'aggregate ' if isinstance(n, exp.AggFunc) else ''}function {name}"
        else:
            what = n.key.upper()
        self.fail(f"unsupported {what}: {n.sql(dialect='spark')}")

    def boolean(self, n: exp.Expression) -> Expr:
        e, t = self.node(n)
        if _kind(t) not in ("bool", "null"):
            self.fail(f"{n.sql(dialect='spark')} is not a boolean expression")
        return e

    def numeric(self, n: exp.Expression, what: str) -> _Typed:
        e, t = self.node(n)
        if _kind(t) not in _NUMERIC | {"null"}:
            self.fail(f"{what} needs a number, got {t} ({n.sql(dialect='spark')})")
        return e, t

    @staticmethod
    def widen(e: Expr, other: pa.DataType | None) -> Expr:
        """An integer literal meeting a DECIMAL becomes DECIMAL(digits, 0), as in Spark.

        Arrow cannot cast BIGINT to a DECIMAL(10,2) operand (it needs 21 digits), which
        would break ``price > 2`` in ``to_arrow`` filters, where column types are unknown.
        """
        if isinstance(e, Literal) and _kind(e.type) == "int" and _kind(other) == "decimal":
            return Literal(Decimal(e.value))
        return e

    def coerce(self, e: Expr, other: pa.DataType | None) -> Expr:
        """A string literal compared with a non-string value takes that value's type."""
        if not (isinstance(e, Literal) and isinstance(e.value, str)):
            return self.widen(e, other)
        if _kind(other) not in ("int", "float", "decimal", "bool", "date", "timestamp", "binary"):
            return e
        assert other is not None
        try:
            return _coerce_string(e.value, other, exact=True)
        except ValueError as err:
            self.fail(str(err))

    def compare(self, op: str, a: exp.Expression, b: exp.Expression) -> Call:
        (left, lt), (right, rt) = self.node(a), self.node(b)
        left, right = self.coerce(left, rt), self.coerce(right, lt)
        lt = left.type if isinstance(left, Literal) else lt
        rt = right.type if isinstance(right, Literal) else rt
        if not _comparable(lt, rt):
            self.fail(f"cannot compare {lt} with {rt}")
        return Call(op, (left, right))

    def in_list(self, n: exp.In) -> Call:
        value, vt = self.node(n.this)
        items: list[Expr] = []
        for item in n.expressions:
            e, t = self.node(item)
            e = self.coerce(e, vt)
            t = e.type if isinstance(e, Literal) else t
            if not _comparable(vt, t):
                self.fail(f"cannot compare {vt} with {t} in IN list")
            items.append(e)
        return Call("in", (value, *items))

    def like(self, n: exp.Like) -> Expr:
        value, t = self.node(n.this)
        pattern = n.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            self.fail("LIKE needs a string literal pattern")
        if _kind(t) not in ("string", "null"):
            self.fail(f"LIKE needs a string value, got {t}")
        call = Call("like", (value, Literal(pattern.this, pa.string())))
        return Call("not", (call,)) if n.args.get("negate") else call

    def arithmetic(self, op: str, a: exp.Expression, b: exp.Expression) -> _Typed:
        (left, lt), (right, rt) = self.numeric(a, op), self.numeric(b, op)
        left, right = self.widen(left, rt), self.widen(right, lt)
        t = _common_type(lt, rt)
        if op == "div" and _kind(t) != "decimal":
            t = _F64  # Spark: integer / integer is DOUBLE
        return Call(op, (left, right)), t

    def cast(self, n: exp.Cast) -> _Typed:
        to = n.to
        if to.this in (exp.DataType.Type.DECIMAL, exp.DataType.Type.BIGDECIMAL):
            params = [int(p.name) for p in to.expressions] or [10]
            if not 1 <= params[0] <= 38:
                self.fail(f"unsupported type {to.sql(dialect='spark')}")
            target = pa.decimal128(params[0], params[1] if len(params) > 1 else 0)
        elif to.this in _SQL_TYPES and (not to.expressions or _SQL_TYPES[to.this] == pa.string()):
            target = _SQL_TYPES[to.this]
        else:
            self.fail(f"unsupported type {to.sql(dialect='spark')} in CAST")
        arg, _ = self.node(n.this)
        if isinstance(arg, Literal):
            try:
                return _fold_cast(arg, target), target
            except ValueError as e:
                self.fail(str(e))
        return Call("cast", (arg, Literal(None, target))), target

    def coalesce(self, nodes: list[exp.Expression]) -> _Typed:
        typed = [self.node(a) for a in nodes]
        t: pa.DataType | None = None
        for _, at in typed:
            common = _common_type(t, at)
            if not _comparable(t, at):
                self.fail(f"COALESCE mixes {t} and {at}")
            t = _canonical(common) if _kind(common) in ("string", "binary") else common
        return Call("coalesce", tuple(e for e, _ in typed)), t

    def column(self, parts: list[str]) -> _Typed:
        written = ".".join(parts)
        if not self.qualifiers:
            hit = self.lookup(parts, self.schema)
            if hit is None:
                raise UnknownColumnError(written, list(self.schema.names), self.context)
            return Column(hit[0]), hit[1]
        if len(parts) > 1:
            alias = _match_key(parts[0], list(self.qualifiers))
            hit = None if alias is None else self.lookup(parts[1:], self.qualifiers[alias])
            if alias is not None and hit is not None:
                return Column(hit[0], alias), hit[1]
        hits = [(a, h) for a, s in self.qualifiers.items() if (h := self.lookup(parts, s)) is not None]
        if len(hits) > 1:
            self.fail(f"ambiguous column {written!r}: qualify it as one of {[a for a, _ in hits]}")
        if not hits:
            available = [f"{a}.{name}" for a, s in self.qualifiers.items() for name in s.names]
            raise UnknownColumnError(written, available, self.context)
        alias, (name, t) = hits[0]
        return Column(name, alias), t

    def lookup(self, parts: list[str], schema: pa.Schema) -> tuple[str, pa.DataType] | None:
        """Case-insensitive resolution: a top-level name (dots included) or a struct path."""
        fields = list(schema)
        whole = self.field(fields, ".".join(parts))
        if whole is not None:
            return whole.name, whole.type
        names: list[str] = []
        found: pa.Field | None = None
        for part in parts:
            found = self.field(fields, part)
            if found is None:
                return None
            names.append(found.name)
            t = found.type
            fields = [t.field(i) for i in range(t.num_fields)] if pa.types.is_struct(t) else []
        assert found is not None
        return ".".join(names), found.type

    def field(self, fields: list[pa.Field], name: str) -> pa.Field | None:
        exact = [f for f in fields if f.name == name]
        if exact:
            return exact[0]
        loose = [f for f in fields if f.name.lower() == name.lower()]
        if len(loose) > 1:
            self.fail(f"ambiguous column {name!r}: matches {[f.name for f in loose]}")
        return loose[0] if loose else None


def _match_key(name: str, keys: list[str]) -> str | None:
    if name in keys:
        return name
    loose = [k for k in keys if k.lower() == name.lower()]
    return loose[0] if len(loose) == 1 else None


def _column_parts(n: exp.Expression) -> list[str] | None:
    if isinstance(n, exp.Column) and not isinstance(n.this, exp.Star):
        return [p.name for p in n.parts]
    if isinstance(n, exp.Dot) and isinstance(n.expression, exp.Identifier):
        head = _column_parts(n.this)
        return None if head is None else [*head, n.expression.name]
    return None


def parse_predicate(
    sql: str,
    schema: pa.Schema,
    *,
    qualifiers: Mapping[str, pa.Schema] | None = None,
    context: str = "predicate",
) -> Expr:
    """Parse a boolean SQL predicate; PredicateError if unsupported or not boolean.

    With ``qualifiers`` (MERGE: ``{"t": target, "s": source}``) names resolve in those schemas
    only and ``schema`` is not consulted.
    """
    parser = _Parser(sql, schema, qualifiers, context)
    expr, t = parser.parse()
    if _kind(t) not in ("bool", "null"):
        parser.fail(f"not a boolean predicate (type {t})")
    return expr


def parse_expression(
    sql: str,
    schema: pa.Schema,
    *,
    qualifiers: Mapping[str, pa.Schema] | None = None,
    context: str = "expression",
) -> Expr:
    """Parse a SQL value expression (an UPDATE/MERGE SET right-hand side)."""
    return _Parser(sql, schema, qualifiers, context).parse()[0]


# --------------------------------------------------------------------------- tree utilities


def referenced_columns(expr: Expr) -> set[Column]:
    """Every column the expression reads."""
    out: set[Column] = set()
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Column):
            out.add(e)
        elif isinstance(e, Call):
            stack.extend(e.args)
    return out


def conjuncts(expr: Expr) -> list[Expr]:
    """The operands of the top-level AND chain, left to right."""
    if isinstance(expr, Call) and expr.op == "and":
        return [c for arg in expr.args for c in conjuncts(arg)]
    return [expr]


def conjoin(exprs: Sequence[Expr]) -> Expr:
    """AND the expressions together (left-nested), dropping TRUE; TRUE if none remain."""
    kept = [e for e in exprs if e != TRUE]
    return functools.reduce(lambda a, b: Call("and", (a, b)), kept) if kept else TRUE


def partition_predicate(expr: Expr, partition_columns: Collection[str]) -> Expr | None:
    """AND of the conjuncts that read only partition columns (at least one); None if none.

    Columns match by name, case-insensitively, whatever their qualifier. A conjunct mixing
    partition and data columns is left out (Delta semantics), so the result is implied by
    ``expr`` but weaker.
    """
    names = {c.lower() for c in partition_columns}
    kept = [
        c
        for c in conjuncts(expr)
        if (cols := referenced_columns(c)) and all(col.name.lower() in names for col in cols)
    ]
    return conjoin(kept) if kept else None


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
    if op in ("coalesce", "lower", "upper", "abs"):
        return f"{op.upper()}({', '.join(to_sql(a) for a in args)})"
    raise PredicateError(f"unknown operator {op!r}", expression=repr(expr))


def _cast_target(call: Call) -> pa.DataType:
    target = call.args[1]
    if not (isinstance(target, Literal) and target.type is not None):
        raise PredicateError(
            "cast needs Literal(None, target_type) as second argument", expression=repr(call)
        )
    return target.type


# --------------------------------------------------------------------------- evaluation

_BINARY: dict[str, Callable[..., Any]] = {
    "and": pc.and_kleene,
    "or": pc.or_kleene,
    "eq": pc.equal,
    "ne": pc.not_equal,
    "lt": pc.less,
    "le": pc.less_equal,
    "gt": pc.greater,
    "ge": pc.greater_equal,
    "add": pc.add_checked,
    "sub": pc.subtract_checked,
    "mul": pc.multiply_checked,
}
# unary op -> (kernel, type a NULL operand is cast to, since kernels reject the null type)
_UNARY: dict[str, tuple[Callable[..., Any], pa.DataType]] = {
    "not": (pc.invert, _BOOL),
    "is_null": (pc.is_null, _BOOL),
    "is_not_null": (pc.is_valid, _BOOL),
    "neg": (pc.negate_checked, pa.int64()),
    "abs": (pc.abs_checked, pa.int64()),
    "lower": (pc.utf8_lower, pa.string()),
    "upper": (pc.utf8_upper, pa.string()),
}
_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)


def _unify(a: Any, b: Any) -> tuple[Any, Any]:
    t = _common_type(a.type, b.type)
    if t is None:
        raise pa.ArrowTypeError(f"incompatible types {a.type} and {b.type}")
    if pa.types.is_null(t):
        t = pa.int64()  # NULL = NULL, NULL + NULL: kernels need a concrete type; all NULL anyway
    return _cast_values(a, t), _cast_values(b, t)


def _cast_values(v: Any, t: pa.DataType) -> Any:
    if v.type == t:
        return v
    if _kind(v.type) == "decimal" and _kind(t) == "float":
        # Arrow's direct cast is inexact (DECIMAL(21,11) 1.0 -> 0.9999999999999999); parsing is not
        return pc.cast(pc.cast(v, pa.string()), t)
    try:
        return pc.cast(v, t)
    except pa.ArrowInvalid:
        if _kind(v.type) == "string" and pa.types.is_timestamp(t) and t.tz:
            # Arrow wants an offset in the text; Spark reads a naive string as session time (UTC)
            return pc.cast(pc.cast(v, pa.timestamp(t.unit)), t)
        source, target = _kind(v.type), _kind(t)
        if source == "int" and target == "decimal":
            # Arrow rejects int64 -> DECIMAL(5,1) by type; Spark checks the values instead
            wide = pa.decimal128(38, t.scale) if t.scale <= 18 else pa.decimal256(76, t.scale)
            return pc.cast(pc.cast(v, wide), t)
        if source == "float" and target == "int":
            return pc.cast(pc.trunc(v), t)  # Spark truncates toward zero
        if source == "decimal" and target == "decimal":  # Spark rounds HALF_UP (away from zero)
            return pc.cast(pc.round(v, ndigits=t.scale, round_mode="half_towards_infinity"), t)
        raise


def _apply(fn: Callable[..., Any], a: Any, b: Any) -> Any:
    """``fn(a, b)`` on arrays/scalars; on a type mismatch cast both to their common type."""
    kinds = {_kind(a.type), _kind(b.type)}
    decimal = "decimal" in kinds
    if kinds == {"decimal", "float"}:
        return fn(*_unify(a, b))
    try:
        return fn(a, b)
    except _ARROW_ERRORS:
        if a.type == b.type and not decimal and not pa.types.is_null(a.type):
            raise
    try:  # Arrow's implicit casts miss some pairs (int64 vs DECIMAL(3,2), naive vs UTC time)
        return fn(*_unify(a, b))
    except pa.ArrowInvalid:
        if not decimal:
            raise
        # a DECIMAL result beyond 38 digits: compute in DOUBLE (Spark would drop scale digits)
        return fn(_cast_values(a, _F64), _cast_values(b, _F64))


def _value_set(items: Sequence[Expr]) -> pa.Array | None:
    """The non-NULL items of an IN list as one array, if they are all literals of one kind."""
    lits = [i for i in items if isinstance(i, Literal)]
    present = [i for i in lits if i.value is not None]
    if len(lits) != len(items) or len({_kind(i.type) for i in present}) != 1:
        return None
    t: pa.DataType | None = None
    for i in present:
        t = _common_type(t, i.type)
    try:
        return pa.array([i.value for i in present], t)
    except (pa.ArrowException, TypeError, ValueError):
        return None


def _in_set(value: Any, values: pa.Array, *, has_null: bool) -> Any:
    """``value IN values`` with SQL semantics: a NULL value gives NULL, and so does a miss when
    the list held a NULL (so that NOT IN never turns those rows TRUE)."""
    null = pa.scalar(None, _BOOL)
    hit = pc.if_else(pc.is_valid(value), pc.is_in(value, value_set=values), null)
    return pc.if_else(hit, True, null) if has_null else hit


def _any(tests: list[Any]) -> Any:
    """OR (Kleene) of the tests as a balanced tree, which keeps Arrow expressions shallow."""
    if not tests:
        return pa.scalar(False)
    while len(tests) > 1:
        pairs = [pc.or_kleene(x, y) for x, y in zip(tests[::2], tests[1::2], strict=False)]
        tests = pairs + tests[len(pairs) * 2 :]
    return tests[0]


class _Lowering:
    """Lowers an Expr to pyarrow compute calls on concrete values (arrays and scalars)."""

    def __init__(self, table: pa.Table | pa.RecordBatch | None, resolve: Callable[[Column], str] | None):
        self.table, self.resolve = table, resolve

    def name(self, col: Column) -> str:
        return self.resolve(col) if self.resolve is not None else col.name

    def column(self, col: Column) -> Any:
        assert self.table is not None
        name, names = self.name(col), self.table.schema.names
        if name in names:
            return self.table.column(name)
        head, *rest = name.split(".")
        if not rest or head not in names:
            raise UnknownColumnError(name, list(names), "evaluation")
        value = self.table.column(head)
        for part in rest:
            value = pc.struct_field(value, part)
        return value

    def literal(self, lit: Literal) -> Any:
        return pa.scalar(lit.value, lit.type) if lit.type is not None else pa.scalar(None)

    def typeof(self, v: Any) -> pa.DataType | None:
        return v.type

    def binary(self, fn: Callable[..., Any], a: Any, b: Any) -> Any:
        return _apply(fn, a, b)

    def cast(self, v: Any, t: pa.DataType) -> Any:
        return _cast_values(v, t)

    def run(self, e: Expr) -> Any:
        if isinstance(e, Column):
            return self.column(e)
        if isinstance(e, Literal):
            return self.literal(e)
        op = e.op
        if op == "cast":
            return self.cast(self.run(e.args[0]), _cast_target(e))
        if op == "in":
            return self.isin(self.run(e.args[0]), e.args[1:])
        args = [self.run(a) for a in e.args]
        if op in ("and", "or"):
            args = [self.boolean(a) for a in args]
        if op in _BINARY:
            return self.binary(_BINARY[op], args[0], args[1])
        if op in _UNARY:
            fn, null_type = _UNARY[op]
            return fn(self.cast(args[0], null_type) if self.null_typed(args[0]) else args[0])
        if op == "like":
            pattern = e.args[1]
            if not (isinstance(pattern, Literal) and isinstance(pattern.value, str)):
                raise PredicateError("LIKE needs a string literal pattern", expression=to_sql(e))
            value = self.cast(args[0], pa.string()) if self.null_typed(args[0]) else args[0]
            return pc.match_like(value, pattern=pattern.value)
        if op == "eq_null_safe":
            equal = self.boolean(self.binary(pc.equal, args[0], args[1]))
            both_null = pc.and_kleene(pc.is_null(args[0]), pc.is_null(args[1]))
            return pc.or_kleene(pc.coalesce(equal, pa.scalar(False)), both_null)
        if op == "div":
            return self.divide(args[0], args[1])
        if op == "mod":
            return self.binary(pc.remainder_checked, args[0], self.null_if_zero(args[1]))
        if op == "coalesce":
            return self.coalesce(args)
        raise PredicateError(f"unknown operator {op!r}", expression=repr(e))

    def null_typed(self, v: Any) -> bool:
        t = self.typeof(v)
        return t is not None and pa.types.is_null(t)

    def boolean(self, v: Any) -> Any:
        return self.cast(v, _BOOL) if self.null_typed(v) else v

    def null_if_zero(self, v: Any) -> Any:
        # Spark (non-ANSI) gives NULL for x / 0 and x % 0; Arrow would raise or return inf.
        t = self.typeof(v)
        return pc.if_else(self.binary(pc.equal, v, pa.scalar(0)), pa.scalar(None, t or _F64), v)

    def divide(self, a: Any, b: Any) -> Any:
        kinds = {_kind(self.typeof(a)), _kind(self.typeof(b))}
        if "decimal" in kinds and kinds <= {"decimal", "int", "null"}:
            return self.binary(pc.divide, a, self.null_if_zero(b))
        a, b = self.cast(a, _F64), self.cast(b, _F64)
        return pc.divide(a, self.null_if_zero(b))

    def isin(self, value: Any, items: Sequence[Expr]) -> Any:
        values = _value_set(items) if not isinstance(value, pa.Scalar) else None
        if values is None:
            return _any([self.boolean(self.binary(pc.equal, value, self.run(i))) for i in items])
        return _in_set(*_unify(value, values), has_null=len(values) < len(items))

    def coalesce(self, args: list[Any]) -> Any:
        t: pa.DataType | None = None
        for a in args:
            t = _common_type(t, a.type)
            if t is None:
                raise pa.ArrowTypeError("COALESCE arguments have incompatible types")
        return pc.coalesce(*[_cast_values(a, t) for a in args]) if t is not None else args[0]


def _explicit_casts(e: Expr, column_type: Callable[[Column], pa.DataType | None]) -> tuple[Expr, Any]:
    """Spell out the casts Arrow's expression binder does not infer, and the result type.

    The binder cannot compare or combine an integer with a DECIMAL(10,2) (it wants 21
    digits), nor type a bare NULL. Casts it does infer are left to it, so that a plain
    ``column op literal`` stays recognisable for Parquet statistics pushdown. A type of
    None means unknown (a column outside the schema).
    """
    if isinstance(e, Column):
        return e, column_type(e)
    if isinstance(e, Literal):
        return e, e.type if e.type is not None else pa.null()
    if e.op == "cast":
        return Call("cast", (_explicit_casts(e.args[0], column_type)[0], e.args[1])), _cast_target(e)
    typed = [_explicit_casts(a, column_type) for a in e.args]
    args, types = [a for a, _ in typed], [t for _, t in typed]
    op, common, mixed = e.op, None, e.op in (*_COMPARISONS, *_ARITHMETIC, "in", "coalesce")
    if op in ("and", "or", "not"):
        common = _BOOL
    elif mixed and None not in types:
        for t in types:
            if not _comparable(common, t):
                common = None  # incompatible: leave it to Arrow (and its error)
                break
            common = _common_type(common, t)
        common = pa.int64() if common is not None and pa.types.is_null(common) else common
    decimal = mixed and "decimal" in {_kind(t) for t in types}
    for i, (a, t) in enumerate(zip(args, types, strict=True)):
        kind = _kind(t)
        target = common if kind == "null" else _as_decimal(t) if decimal and kind == "int" else None
        if target is not None and t != target:
            args[i] = (
                Literal(None, target) if a == Literal(None) else Call("cast", (a, Literal(None, target)))
            )
            types[i] = target
    out = Call(op, tuple(args))
    if op in ("neg", "abs", "coalesce"):
        return out, types[0] if op != "coalesce" else common
    if op in ("lower", "upper"):
        return out, pa.string()
    if op in _ARITHMETIC and None not in types:
        if op == "div":
            return out, _F64  # the lowering below divides in DOUBLE
        try:
            fn = _BINARY.get(op, pc.remainder_checked)
            return out, fn(pa.array([], types[0]), pa.array([], types[1])).type
        except _ARROW_ERRORS:
            cast_args = tuple(Call("cast", (a, Literal(None, _F64))) for a in args)
            return Call(op, cast_args), _F64  # DECIMAL result beyond 38 digits
    return out, (None if op in _ARITHMETIC else _BOOL)


class _ExpressionLowering(_Lowering):
    """The same lowering onto ``pyarrow.compute.Expression`` (types unknown until bound)."""

    def __init__(self, resolve: Callable[[Column], str] | None, schema: pa.Schema | None) -> None:
        super().__init__(None, resolve)
        self.schema = schema

    def column(self, col: Column) -> Any:
        name = self.name(col)
        if "." in name and (self.schema is None or name not in self.schema.names):
            return pc.field(*name.split("."))  # a struct path, unless the schema has that name
        return pc.field(name)

    def column_type(self, col: Column) -> pa.DataType | None:
        name = self.name(col)
        if self.schema is None or name in self.schema.names:
            return None if self.schema is None else self.schema.field(name).type
        t: Any = pa.struct(list(self.schema))
        for part in name.split("."):
            if not pa.types.is_struct(t) or t.get_field_index(part) < 0:
                return None
            t = t.field(part).type
        return t

    def literal(self, lit: Literal) -> Any:
        return pc.scalar(super().literal(lit))

    def typeof(self, v: Any) -> pa.DataType | None:
        return None

    def binary(self, fn: Callable[..., Any], a: Any, b: Any) -> Any:
        return fn(a, b)

    def cast(self, v: Any, t: pa.DataType) -> Any:
        return v.cast(t)

    def null_if_zero(self, v: Any) -> Any:
        # compare in DOUBLE: Arrow cannot compare a DECIMAL(10,2) with a BIGINT 0 (zero stays zero)
        return pc.if_else(pc.equal(v.cast(_F64), pc.scalar(0.0)), pc.scalar(pa.scalar(None)), v)

    def run(self, e: Expr) -> Any:
        if isinstance(e, Call) and e.op == "in" and isinstance(e.args[0], Column):
            # is_in casts its input to the value set's type when bound, so it is only used
            # when the set can be given the column's own type exactly (needs ``schema``)
            t, values = self.column_type(e.args[0]), _value_set(e.args[1:])
            if t is not None and values is not None:
                try:
                    exact = values.cast(t)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    exact = None  # a value the column cannot hold: compare pairwise instead
                if exact is not None:
                    return _in_set(self.column(e.args[0]), exact, has_null=len(values) < len(e.args) - 1)
        return super().run(e)

    def isin(self, value: Any, items: Sequence[Expr]) -> Any:
        # input types unknown: pairwise equality lets Arrow pick exact casts for each pair
        return _any([pc.equal(value, self.run(i)) for i in items])

    def coalesce(self, args: list[Any]) -> Any:
        return pc.coalesce(*args)


def evaluate(
    expr: Expr, table: pa.Table | pa.RecordBatch, resolve: Callable[[Column], str] | None = None
) -> pa.Array | pa.ChunkedArray:
    """The value of ``expr`` for every row (constants broadcast to ``table.num_rows``).

    ``resolve`` maps a Column to the table's field name (default ``col.name``; a dotted name
    not present as a field is followed into struct columns). Runtime failures such as
    overflow or a failed CAST raise PredicateError.
    """
    try:
        out = _Lowering(table, resolve).run(expr)
    except _ARROW_ERRORS as e:
        sql = to_sql(expr)
        raise PredicateError(f"cannot evaluate {sql}: {e}", expression=sql) from e
    return pa.repeat(out, table.num_rows) if isinstance(out, pa.Scalar) else out


def evaluate_mask(
    expr: Expr, table: pa.Table | pa.RecordBatch, resolve: Callable[[Column], str] | None = None
) -> pa.BooleanArray:
    """Rows where the predicate is TRUE (NULL counts as FALSE): one chunk, ``num_rows`` long."""
    values = evaluate(expr, table, resolve)
    if _kind(values.type) not in ("bool", "null"):
        sql = to_sql(expr)
        raise PredicateError(f"not a boolean predicate (type {values.type}): {sql}", expression=sql)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return pc.fill_null(values.cast(_BOOL), False)


def to_arrow(
    expr: Expr, resolve: Callable[[Column], str] | None = None, *, schema: pa.Schema | None = None
) -> pc.Expression:
    """The expression as a ``pyarrow.compute.Expression`` (e.g. a ``pyarrow.dataset`` filter).

    Same semantics as :func:`evaluate`, except that ``/`` computes in DOUBLE. ``schema`` (of
    the data the filter is bound to) lets integer columns meet DECIMAL operands
    (``qty * price > 10``); without it, only literals are typed.
    """
    lowering = _ExpressionLowering(resolve, schema)
    typed, _ = _explicit_casts(expr, lowering.column_type)
    out = lowering.run(Literal(None, _BOOL) if typed == Literal(None) else typed)
    return out if isinstance(out, pc.Expression) else pc.scalar(out)


def may_match(expr: Expr, stats: pa.Table) -> list[bool]:
    """Per data file: may it hold a row satisfying ``expr``? See :mod:`eventlog.skipping`."""
    from eventlog.skipping import may_match as _may_match  # skipping imports this module

    return _may_match(expr, stats)
