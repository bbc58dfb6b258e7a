"""Evaluation of expression trees with pyarrow compute, following Spark SQL semantics:
:func:`evaluate` and :func:`evaluate_mask` lower a tree onto concrete arrays and scalars
(casting operands to their common type, NULL for division by zero, errors for overflow and
failed casts), and :func:`to_arrow` lowers it onto a ``pyarrow.compute.Expression`` (e.g. a
``pyarrow.dataset`` filter), spelling out the casts Arrow's binder does not infer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eventlog.errors import PredicateError, UnknownColumnError
from eventlog.expr.nodes import (
    _ARITHMETIC,
    _COMPARISONS,
    Call,
    Column,
    Expr,
    Literal,
    _cast_target,
    tree_depth,
)
from eventlog.expr.render import to_sql
from eventlog.expr.types import _BOOL, _F64, _as_decimal, _common_type, _comparable, _kind

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


def _int32(v: Any) -> Any:
    """Spark's INT result of LENGTH and the date parts (Arrow gives int64 for most)."""
    return v.cast(pa.int32()) if isinstance(v, pc.Expression) else pc.cast(v, pa.int32())


# unary op -> (kernel, type a NULL operand is cast to, since kernels reject the null type)
_UNARY: dict[str, tuple[Callable[..., Any], pa.DataType]] = {
    "not": (pc.invert, _BOOL),
    "is_null": (pc.is_null, _BOOL),
    "is_not_null": (pc.is_valid, _BOOL),
    "neg": (pc.negate_checked, pa.int64()),
    "abs": (pc.abs_checked, pa.int64()),
    "lower": (pc.utf8_lower, pa.string()),
    "upper": (pc.utf8_upper, pa.string()),
    "length": (lambda v: _int32(pc.utf8_length(v)), pa.string()),
    "year": (lambda v: _int32(pc.year(v)), pa.date32()),
    "month": (lambda v: _int32(pc.month(v)), pa.date32()),
    "day": (lambda v: _int32(pc.day(v)), pa.date32()),
    "hour": (lambda v: _int32(pc.hour(v)), pa.timestamp("us", "UTC")),
}
INT_FUNCTIONS = ("length", "year", "month", "day", "hour")
ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)
"""What pyarrow raises when a value cannot be computed or cast (callers turn it into a typed error)."""


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
    if pa.types.is_timestamp(v.type) and v.type.tz in ("UTC", "+00:00", "Etc/UTC") and pa.types.is_date(t):
        # the same dates, without a time-zone lookup per value (about 30x faster)
        v = pc.cast(v, pa.timestamp(v.type.unit))
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
    except ARROW_ERRORS:
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
    if getattr(value, "null_count", None) == 0:  # arrays without NULL: one pass instead of three
        fixed = _fixed_width_in(value, values)
        hit = fixed if fixed is not None else pc.is_in(value, value_set=values)
    else:
        hit = pc.if_else(pc.is_valid(value), pc.is_in(value, value_set=values), null)
    return pc.if_else(hit, True, null) if has_null else hit


_WIDTHS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _fixed_width_in(value: Any, values: pa.Array) -> pa.Array | pa.ChunkedArray | None:
    """``value IN values`` for strings that all have one byte width of 1, 2, 4 or 8 (codes such
    as 'a', 'EU', 'EUR_'), compared as integers: several times faster than hashing each
    string. None where that does not apply (the caller hashes)."""
    if not (pa.types.is_string(values.type) or pa.types.is_binary(values.type)) or not len(values):
        return None
    chunks = value.chunks if isinstance(value, pa.ChunkedArray) else [value]
    if not chunks or not all(pa.types.is_string(c.type) or pa.types.is_binary(c.type) for c in chunks):
        return None
    wanted = {len(v) for v in values.cast(pa.binary()).to_pylist()}
    if len(wanted) != 1 or (width := wanted.pop()) not in _WIDTHS:
        return None
    lengths = pc.min_max(pc.binary_length(value))
    if lengths["min"].as_py() != width or lengths["max"].as_py() != width:
        return None
    dtype = _WIDTHS[width]
    codes = np.frombuffer(b"".join(values.cast(pa.binary()).to_pylist()), dtype=dtype)
    out = []
    for chunk in chunks:
        offsets = np.frombuffer(
            chunk.buffers()[1], dtype=np.int32, count=len(chunk) + 1, offset=chunk.offset * 4
        )
        start = int(offsets[0])
        data = (
            np.frombuffer(chunk.buffers()[2], dtype=dtype, count=len(chunk), offset=start)
            if len(chunk)
            else np.empty(0, dtype)
        )
        if width <= 2:  # a lookup table over every possible code: one gather
            table = np.zeros(1 << (8 * width), dtype=bool)
            table[codes] = True
            out.append(pa.array(table[data], _BOOL))
        else:
            out.append(pa.array(np.isin(data, codes), _BOOL))
    return pa.chunked_array(out, _BOOL) if isinstance(value, pa.ChunkedArray) else out[0]


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
    if op in INT_FUNCTIONS:
        return out, pa.int32()
    if op in _ARITHMETIC and None not in types:
        if op == "div":
            return out, _F64  # the lowering below divides in DOUBLE
        try:
            fn = _BINARY.get(op, pc.remainder_checked)
            return out, fn(pa.array([], types[0]), pa.array([], types[1])).type
        except ARROW_ERRORS:
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
    except ARROW_ERRORS as e:
        sql = to_sql(expr)
        raise PredicateError(f"cannot evaluate {sql}: {e}", expression=sql) from e
    except RecursionError:
        raise _too_deep(expr) from None
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
    try:
        typed, _ = _explicit_casts(expr, lowering.column_type)
        out = lowering.run(Literal(None, _BOOL) if typed == Literal(None) else typed)
    except RecursionError:
        raise _too_deep(expr) from None
    return out if isinstance(out, pc.Expression) else pc.scalar(out)


def _too_deep(expr: Expr) -> PredicateError:
    """Backstop for trees not built by the parser (which bounds their depth)."""
    depth = tree_depth(expr)
    return PredicateError(
        f"expression nested {depth} levels deep is too deep to evaluate", expression=f"<{depth} levels>"
    )
