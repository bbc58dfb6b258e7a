"""The expression tree: three frozen node types (:class:`Column`, :class:`Literal`,
:class:`Call`; ``Expr`` is their union), the constant :data:`TRUE`, and the pure tree
utilities built on them (:func:`referenced_columns`, :func:`conjuncts`, :func:`conjoin`,
:func:`partition_predicate`). The operator vocabulary of ``Call.op`` is described in
:mod:`eventlog.expr`.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import pyarrow as pa

from eventlog.errors import PredicateError
from eventlog.expr.types import _natural_type

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
    """An operator or function applied to arguments; see :mod:`eventlog.expr` for ``op``."""

    op: str
    args: tuple[Expr, ...]


Expr: TypeAlias = Column | Literal | Call

_COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge", "eq_null_safe")
_ARITHMETIC = ("add", "sub", "mul", "div", "mod")

TRUE: Expr = Literal(True)

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


def tree_depth(expr: Expr) -> int:
    """Levels of the tree (a leaf is 1); iterative, so any depth can be measured."""
    deepest = 0
    stack: list[tuple[Expr, int]] = [(expr, 1)]
    while stack:
        e, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(e, Call):
            stack.extend((a, depth + 1) for a in e.args)
    return deepest


def tree_size(expr: Expr) -> int:
    """Nodes in the tree; iterative, so any size can be counted."""
    count = 0
    stack = [expr]
    while stack:
        e = stack.pop()
        count += 1
        if isinstance(e, Call):
            stack.extend(e.args)
    return count


def conjuncts(expr: Expr) -> list[Expr]:
    """The operands of the top-level AND chain, left to right (however the chain nests)."""
    out: list[Expr] = []
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Call) and e.op == "and":
            stack.extend(reversed(e.args))
        else:
            out.append(e)
    return out


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


def _cast_target(call: Call) -> pa.DataType:
    target = call.args[1]
    if not (isinstance(target, Literal) and target.type is not None):
        raise PredicateError(
            "cast needs Literal(None, target_type) as second argument", expression=repr(call)
        )
    return target.type
