"""SQL literals: Spark's typing of numeric literals (:func:`_number_literal`), conversion
of string literals to the type they are compared with or cast to (:func:`_coerce_string`),
and casts of literals evaluated at parse time (:func:`_fold_cast`). Each raises ValueError
for a literal that does not denote a value of the type; the parser reports it.
"""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation

import pyarrow as pa

from eventlog.expr.nodes import Literal
from eventlog.expr.types import _F64, _UTC, _canonical, _decimal_type, _kind, _type_sql

_WIDE = Context(prec=100)  # decimal arithmetic on up to 76 digits without silent rounding
_MAX_LITERAL_DIGITS = 76  # the widest decimal Arrow holds (DECIMAL256)


def _number_literal(text: str) -> Literal:
    """Spark's typing of a numeric literal: 1 -> BIGINT, 1.50 -> DECIMAL(3,2), 1e3 -> DOUBLE.

    ValueError for an integer or decimal literal of more than 76 digits.
    """
    if "e" in text or "E" in text:
        return Literal(float(text), _F64)
    digits = sum(c.isdigit() for c in text.lstrip("-+0."))
    if digits > _MAX_LITERAL_DIGITS:
        raise ValueError(f"a numeric literal of {digits} digits (at most {_MAX_LITERAL_DIGITS})")
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
