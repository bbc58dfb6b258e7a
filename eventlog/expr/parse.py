"""Spark SQL text to expression trees: the sqlglot-based parser behind
:func:`parse_predicate` and :func:`parse_expression`, which resolves column names
(case-insensitively, MERGE aliases included) against the table schema and type-checks the
tree while building it; literals are typed, converted and folded by
:mod:`eventlog.expr.literals`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, NoReturn, TypeAlias

import pyarrow as pa
from sqlglot import Token, TokenType, exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import SqlglotError

from eventlog.errors import PredicateError, UnknownColumnError
from eventlog.expr.literals import _coerce_string, _fold_cast, _number_literal
from eventlog.expr.nodes import Call, Column, Expr, Literal
from eventlog.expr.types import (
    _BOOL,
    _F64,
    _NUMERIC,
    _canonical,
    _common_type,
    _comparable,
    _kind,
)
from eventlog.userinput import MAX_EXPRESSION_DEPTH, MAX_NESTING_DEPTH, text_problem

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
# date part -> the argument kinds it takes (Spark casts dates to timestamps for HOUR)
_DATE_PARTS: dict[type[exp.Expression], tuple[str, frozenset[str]]] = {
    exp.Year: ("year", frozenset({"date", "timestamp"})),
    exp.Month: ("month", frozenset({"date", "timestamp"})),
    exp.Day: ("day", frozenset({"date", "timestamp"})),
    exp.DayOfMonth: ("day", frozenset({"date", "timestamp"})),
    exp.Hour: ("hour", frozenset({"timestamp"})),
}
_SPARK = Dialect.get_or_raise("spark")
_OPENING = frozenset({TokenType.L_PAREN, TokenType.L_BRACKET, TokenType.L_BRACE, TokenType.CASE})
_CLOSING = frozenset({TokenType.R_PAREN, TokenType.R_BRACKET, TokenType.R_BRACE, TokenType.END})
_PREFIX = frozenset({TokenType.NOT, TokenType.DASH, TokenType.PLUS, TokenType.TILDE})
_LEFT_DEEP_CHAIN = 16  # longer AND/OR chains are balanced (see _chain_call)


def nesting_depth(tokens: list[Token]) -> int:
    """How deeply a token stream nests: brackets and ``CASE ... END`` open a level, and each
    prefix operator in a run (``NOT NOT x``, ``- - 1``) adds one. A cheap, iterative bound on
    the recursion the parser will need (see :data:`eventlog.userinput.MAX_NESTING_DEPTH`)."""
    depth = run = deepest = 0
    for token in tokens:
        kind = token.token_type
        run = run + 1 if kind in _PREFIX else 0
        if kind in _OPENING:
            depth += 1
        elif kind in _CLOSING:
            depth = max(depth - 1, 0)
        deepest = max(deepest, depth + run)
    return deepest


def _chain(n: exp.Expression, kind: type[exp.Expression]) -> list[exp.Expression]:
    """The operands of an AND (or OR) chain, left to right, seeing through parentheses
    around the same operator (``a OR (b OR c)``); iterative, so long chains are fine."""
    out: list[exp.Expression] = []
    stack = [n]
    while stack:
        m = stack.pop()
        while isinstance(m, exp.Paren) and isinstance(m.this, kind):
            m = m.this
        if isinstance(m, kind):
            stack.extend((m.expression, m.this))
        else:
            out.append(m)
    return out


def _chain_call(op: str, items: list[Expr]) -> Expr:
    """``items`` joined by ``op``: left-nested when short (``(a AND b) AND c``), balanced
    halves when longer than 16, so a chain of thousands stays shallow for the evaluators.
    AND and OR are associative (three-valued logic too), and :func:`_chain` reads any
    nesting back as the same list, so ``to_sql`` still round-trips exactly."""
    if len(items) <= _LEFT_DEEP_CHAIN:
        tree = items[0]
        for item in items[1:]:
            tree = Call(op, (tree, item))
        return tree
    mid = len(items) // 2
    return Call(op, (_chain_call(op, items[:mid]), _chain_call(op, items[mid:])))


class _Parser:
    def __init__(
        self, sql: str, schema: pa.Schema, qualifiers: Mapping[str, pa.Schema] | None, context: str
    ) -> None:
        self.sql, self.schema, self.qualifiers, self.context = sql, schema, qualifiers, context
        self.depth = 0

    def fail(self, message: str) -> NoReturn:
        text = self.sql if len(self.sql) <= 500 else self.sql[:480] + f"... ({len(self.sql)} chars)"
        raise PredicateError(f"{message} in {self.context} {text!r}", expression=self.sql)

    def parse(self) -> _Typed:
        """The typed tree; PredicateError for anything it cannot turn into one.

        The text is checked before sqlglot sees it (UTF-8 encodable, nesting at most
        MAX_NESTING_DEPTH), the tree while it is built (at most MAX_EXPRESSION_DEPTH deep).
        Whatever still escapes from sqlglot or the literal conversions (a RecursionError, a
        ValueError) is reported as a PredicateError too: no untyped error leaves the parser.
        """
        if not isinstance(self.sql, str):
            raise PredicateError(f"{self.context} must be a SQL string", expression=repr(self.sql))
        problem = text_problem(self.sql)
        if problem is not None:
            self.fail(f"the text holds {problem[0]} at position {problem[1]}")
        try:
            return self.build()
        except RecursionError:
            self.fail("too deeply nested to parse")
        except (ValueError, ArithmeticError, pa.ArrowException) as e:
            self.fail(f"invalid expression ({str(e).splitlines()[0] if str(e) else type(e).__name__})")

    def build(self) -> _Typed:
        try:
            tokens = _SPARK.tokenize(self.sql)
        except SqlglotError as e:
            self.fail(f"cannot parse ({str(e).splitlines()[0]})")
        depth = nesting_depth(tokens)
        if depth > MAX_NESTING_DEPTH:
            self.fail(f"nested {depth} levels deep; the limit is {MAX_NESTING_DEPTH} (MAX_NESTING_DEPTH)")
        try:
            trees = [tree for tree in _SPARK.parser().parse(tokens, self.sql) if tree is not None]
        except SqlglotError as e:
            self.fail(f"cannot parse ({str(e).splitlines()[0]})")
        if len(trees) != 1 or not isinstance(trees[0], exp.Expression):
            self.fail("expected exactly one expression")
        return self.node(trees[0])

    def node(self, n: exp.Expression) -> _Typed:
        self.depth += 1
        try:
            if self.depth > MAX_EXPRESSION_DEPTH:
                self.fail(f"more than {MAX_EXPRESSION_DEPTH} levels deep (MAX_EXPRESSION_DEPTH)")
            return self.typed(n)
        finally:
            self.depth -= 1

    def typed(self, n: exp.Expression) -> _Typed:
        if isinstance(n, exp.Paren):
            return self.node(n.this)
        if isinstance(n, (exp.And, exp.Or)):
            op = "and" if isinstance(n, exp.And) else "or"
            return _chain_call(op, [self.boolean(m) for m in _chain(n, type(n))]), _BOOL
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
        if isinstance(n, exp.Length) and not n.args.get("binary"):
            arg, t = self.node(n.this)
            if _kind(t) not in ("string", "null"):
                self.fail(f"LENGTH needs a string argument, got {t}")
            return Call("length", (arg,)), pa.int32()
        if isinstance(n, exp.TsOrDsToDate) and n.args.get("format") is None:
            return self.to_date(n.this)
        if type(n) in _DATE_PARTS:
            op, kinds = _DATE_PARTS[type(n)]
            arg, t = self.node(n.this)
            if _kind(t) not in kinds | {"null"}:
                self.fail(f"{op.upper()} needs a {' or '.join(sorted(kinds))} argument, got {t}")
            return Call(op, (arg,)), pa.int32()
        return self.leaf(n)

    def to_date(self, n: exp.Expression) -> _Typed:
        """``to_date(x)`` without a format: ``CAST(x AS DATE)`` (a date stays as it is)."""
        arg, t = self.node(n)
        if _kind(t) == "date":
            return arg, t
        if _kind(t) not in ("string", "timestamp", "null"):
            self.fail(f"TO_DATE needs a string, date or timestamp argument, got {t}")
        if isinstance(arg, Literal):
            try:
                return _fold_cast(arg, pa.date32()), pa.date32()
            except ValueError as e:
                self.fail(str(e))
        return Call("cast", (arg, Literal(None, pa.date32()))), pa.date32()

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
        if (
            isinstance(e, Literal)
            and isinstance(e.value, dt.datetime)
            and e.type == pa.timestamp("us", "UTC")
            and other == pa.timestamp("us")
        ):
            # A TIMESTAMP literal meeting a TIMESTAMP_NTZ value: Spark compares them as
            # instants, reading the NTZ value in the session time zone, which is UTC here.
            return Literal(e.value.astimezone(dt.UTC).replace(tzinfo=None), pa.timestamp("us"))
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


def check_sql_text(sql: object, context: str = "predicate") -> None:
    """PredicateError if ``sql`` is not SQL text the log can record (not a string, or not
    encodable as UTF-8). Operations call it before naming themselves, so that bad SQL is
    always a PredicateError, whichever check would have seen it first."""
    if not isinstance(sql, str):
        raise PredicateError(f"{context} must be a SQL string", expression=repr(sql))
    problem = text_problem(sql)
    if problem is not None:
        _Parser(sql, pa.schema([]), None, context).fail(
            f"the text holds {problem[0]} at position {problem[1]}"
        )


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
