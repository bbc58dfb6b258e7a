"""Data skipping: may a data file hold a row satisfying a predicate, judged by its statistics.

``stats`` has one row per data file: ``numRecords`` and, per data column ``c``, ``min.<c>``,
``max.<c>`` and ``nullCount.<c>``; nulls and absent columns mean "unknown". Every rule below
yields a boolean array over the files whose NULLs mean "unknown", combined with Kleene AND/OR
(an unknown conjunct cannot rescue a provably-false one) and finally filled with True, so a
file is skipped only when the statistics prove that no row matches.

min/max only need to be bounds, not exact values: Delta writers truncate long strings and
store timestamps in milliseconds, so a timestamp max is widened by 1 ms before use.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from eventlog.expr.evaluate import ARROW_ERRORS, _any, _apply, _value_set
from eventlog.expr.nodes import Call, Column, Expr, Literal

_FLIP = {
    "eq": "eq",
    "ne": "ne",
    "lt": "gt",
    "le": "ge",
    "gt": "lt",
    "ge": "le",
    "eq_null_safe": "eq_null_safe",
}
_NEGATE = {"eq": "ne", "ne": "eq", "lt": "ge", "le": "gt", "gt": "le", "ge": "lt"}
_TICKS_PER_MS = {"s": 1, "ms": 1, "us": 1000, "ns": 1_000_000}  # "s": widen by a whole second
_FALSE = pa.scalar(False)
_MAX_IN_TESTS = 32  # IN lists longer than this are checked by their range only


def may_match(expr: Expr, stats: pa.Table) -> list[bool]:
    """For each file (row of ``stats``): False only if no row of it can satisfy ``expr``."""
    result: list[bool] = may_match_mask(expr, stats).to_pylist()
    return result


def may_match_mask(expr: Expr, stats: pa.Table) -> pa.BooleanArray:
    """:func:`may_match` as an Arrow boolean array (no nulls), for filtering file tables."""
    n = stats.num_rows
    verdict = _Skipping(stats).check(expr, negate=False)
    if verdict is None:
        return pa.repeat(pa.scalar(True), n)
    if isinstance(verdict, pa.Scalar):
        return pa.repeat(pa.scalar(verdict.as_py() is not False), n)
    if isinstance(verdict, pa.ChunkedArray):
        verdict = verdict.combine_chunks()
    mask: pa.BooleanArray = pc.fill_null(verdict, True)
    return mask


def _like_prefix(pattern: str) -> str:
    """The literal text every match of a LIKE pattern starts with (backslash escapes)."""
    out: list[str] = []
    chars = iter(pattern)
    for c in chars:
        if c in "%_":
            break
        out.append(next(chars, c) if c == "\\" else c)
    return "".join(out)


def _successor(prefix: str) -> str | None:
    """The smallest string greater than every string starting with ``prefix`` (None: none)."""
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if code <= 0x10FFFF:
            chars[-1] = chr(0xE000 if 0xD800 <= code <= 0xDFFF else code)  # skip surrogates
            return "".join(chars)
        chars.pop()
    return None


def _and(a: Any, b: Any) -> Any:
    """Kleene AND where None (nothing known for any file) is the neutral element."""
    return b if a is None else a if b is None else pc.and_kleene(a, b)


class _Skipping:
    def __init__(self, stats: pa.Table) -> None:
        self.stats, self.names = stats, set(stats.schema.names)

    def get(self, key: str) -> Any:
        return self.stats.column(key) if key in self.names else None

    def check(self, e: Expr, *, negate: bool) -> Any:
        """Boolean array (NULL = unknown), boolean scalar, or None when nothing is known.

        ``negate`` pushes a NOT down: De Morgan through AND/OR, complemented comparisons.
        That is exact under SQL semantics because a comparison with NULL is never TRUE on
        either side of the negation.
        """
        if isinstance(e, Literal):
            if e.value is None:
                return _FALSE  # WHERE NULL and WHERE NOT NULL both select nothing
            return pa.scalar(e.value != negate) if isinstance(e.value, bool) else None
        if isinstance(e, Column):  # a boolean column used as a predicate
            return self.compare("eq", e, Literal(not negate))
        op, args = e.op, e.args
        if op == "not":
            return self.check(args[0], negate=not negate)
        if op in ("and", "or"):
            left, right = self.check(args[0], negate=negate), self.check(args[1], negate=negate)
            if (op == "and") != negate:
                return _and(left, right)
            return None if left is None or right is None else pc.or_kleene(left, right)
        if op in _FLIP:
            return self.comparison(e, negate)
        col = args[0]
        if not isinstance(col, Column):
            return None
        if op in ("is_null", "is_not_null"):
            return self.nulls(col, is_null=(op == "is_null") != negate)
        if op == "in" and all(isinstance(a, Literal) for a in args[1:]):
            return self.in_list(col, [a for a in args[1:] if isinstance(a, Literal)], negate)
        if op == "like" and not negate and isinstance(args[1], Literal):
            return self.prefix(col, _like_prefix(str(args[1].value)))
        return None

    def comparison(self, e: Call, negate: bool) -> Any:
        op, (left, right) = e.op, e.args
        if isinstance(left, Literal) and isinstance(right, Column):
            left, right, op = right, left, _FLIP[op]
        if not (isinstance(left, Column) and isinstance(right, Literal)):
            return None
        if op != "eq_null_safe":
            return self.compare(_NEGATE[op] if negate else op, left, right)
        if right.value is None:  # c <=> NULL is c IS NULL
            return self.nulls(left, is_null=not negate)
        if not negate:
            return self.compare("eq", left, right)
        # NOT (c <=> v) holds for NULLs and for values other than v
        a, b = self.nulls(left, is_null=True), self.compare("ne", left, right)
        return None if a is None or b is None else pc.or_kleene(a, b)

    def in_list(self, col: Column, items: list[Literal], negate: bool) -> Any:
        values = [i for i in items if i.value is not None]
        if not negate and len(values) > _MAX_IN_TESTS and (array := _value_set(values)) is not None:
            # long lists: test the list's [smallest, largest] range, one pass over the files
            bounds = pc.min_max(array)
            low, high = (Literal(bounds[k].as_py(), array.type) for k in ("min", "max"))
            return _and(self.compare("ge", col, low), self.compare("le", col, high))
        if not negate:  # NULL items never make IN true
            tests = [self.compare("eq", col, v) for v in values]
            return None if any(t is None for t in tests) else _any(tests)
        if len(values) < len(items):
            return _FALSE  # x NOT IN (..., NULL) is never TRUE
        verdict = None
        for v in values:
            verdict = _and(verdict, self.compare("ne", col, v))
        return verdict

    def compare(self, op: str, col: Column, lit: Literal) -> Any:
        if lit.value is None:
            return _FALSE  # a comparison with NULL is never TRUE
        lo, hi = self.get(f"min.{col.name}"), self.max(col)
        v = pa.scalar(lit.value, lit.type)
        tests: list[tuple[Any, Any]] = {
            "eq": [(pc.less_equal, lo), (pc.greater_equal, hi)],
            "lt": [(pc.less, lo)],
            "le": [(pc.less_equal, lo)],
            "gt": [(pc.greater, hi)],
            "ge": [(pc.greater_equal, hi)],
        }.get(op, [])
        try:
            verdict = None
            for fn, bound in tests:
                if bound is not None:
                    verdict = _and(verdict, _apply(fn, bound, v))
            if op == "ne" and lo is not None and hi is not None:
                verdict = pc.invert(pc.and_kleene(_apply(pc.equal, lo, v), _apply(pc.equal, hi, v)))
        except ARROW_ERRORS:
            return None  # stats of an unexpected type: know nothing rather than fail the scan
        return None if verdict is None else self.not_all_null(col, verdict)

    def max(self, col: Column) -> Any:
        hi = self.get(f"max.{col.name}")
        if hi is not None and pa.types.is_timestamp(hi.type):
            # stats are written in ms: a max of .123 may stand for .123999
            hi = pc.add(hi, pa.scalar(_TICKS_PER_MS[hi.type.unit], pa.duration(hi.type.unit)))
        return hi

    def not_all_null(self, col: Column, verdict: Any) -> Any:
        """A comparison is never TRUE in a file whose values are all NULL."""
        nulls, rows = self.get(f"nullCount.{col.name}"), self.get("numRecords")
        if nulls is None or rows is None:
            return verdict
        return pc.and_kleene(verdict, pc.not_equal(nulls, rows))

    def nulls(self, col: Column, *, is_null: bool) -> Any:
        nulls = self.get(f"nullCount.{col.name}")
        if nulls is None:
            return None
        if is_null:
            return pc.greater(nulls, 0)
        rows = self.get("numRecords")
        return None if rows is None else pc.less(nulls, rows)

    def prefix(self, col: Column, prefix: str) -> Any:
        """LIKE 'abc%': every match lies in [prefix, successor(prefix))."""
        if not prefix:
            return None
        verdict = self.compare("ge", col, Literal(prefix))
        upper = _successor(prefix)
        return verdict if upper is None else _and(verdict, self.compare("lt", col, Literal(upper)))
