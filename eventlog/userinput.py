"""Validation of user text at the point where it enters the library.

Whatever a caller hands over ends up in the Delta log (JSON), in Parquet files, in paths
or in the SQL parser. Python strings can hold text none of these can: a *lone surrogate*
such as ``"\\ud800"`` has no UTF-8 encoding, so the JSON encoder would fail half-way
through preparing a commit. Every entry point therefore checks its text here first, and
rejects bad input with :class:`~eventlog.errors.InvalidTextError` (fields ``argument``,
``reason``, ``position``) before anything is written; SQL text is rejected by the parser
with :class:`~eventlog.errors.PredicateError` (field ``expression``).

What is checked, and where:

* table URIs (``Table.create``/``open``): a non-empty ``str`` or ``os.PathLike``, UTF-8
  encodable, no NUL (no filesystem path can hold one);
* column names, nested ones included (``Table.create``, schema evolution): non-empty,
  UTF-8 encodable; types nest at most :data:`MAX_TYPE_DEPTH` levels; partition column
  names must fit a directory name (:data:`MAX_PARTITION_COLUMN_BYTES` once escaped);
* table property keys (non-empty) and values, table name and description, ``userMetadata``,
  txn app ids (non-empty) with their versions (non-negative integers): UTF-8 encodable;
* SQL predicates and expressions (DELETE/UPDATE predicates, SET expressions, ``to_arrow``
  filters, ``replace_where``, OPTIMIZE ``partition_filter``, MERGE conditions and values):
  UTF-8 encodable, nested at most :data:`MAX_NESTING_DEPTH` levels in the text and
  :data:`MAX_EXPRESSION_DEPTH` levels once parsed (see :mod:`eventlog.expr.parse`).

NUL characters are allowed everywhere except in paths: the JSON log escapes them
(``\\u0000``), Parquet strings are length-prefixed, and partition directories escape them
(``%00``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from eventlog.errors import InvalidInputError, InvalidTextError

MAX_NESTING_DEPTH = 32
"""Deepest nesting a SQL text may have: parentheses, brackets, ``CASE ... END`` and runs of
prefix operators (``NOT``, unary ``-``/``+``/``~``) each count one level. sqlglot's
recursive-descent parser spends about twenty Python frames per level, so this keeps parsing
well inside Python's default recursion limit (1000) even when called from a deep stack."""

MAX_EXPRESSION_DEPTH = 100
"""Deepest parsed expression tree: nesting plus operator chains such as ``a + b + c``.
``AND``/``OR`` chains do not count: they are flattened and balanced, so any number of
conjuncts or disjuncts is accepted."""

MAX_TYPE_DEPTH = 64
"""Deepest nesting of struct/array/map column types (the JSON schema encoder's limit is
about 84 struct levels)."""

MAX_PATH_COMPONENT_BYTES = 255
"""Longest file or directory name in a local table path (the limit of common filesystems)."""

MAX_LOCAL_PATH_BYTES = 3072
"""Longest local table directory: PATH_MAX is 4096 bytes, and files nest a few levels below
the table (``_eventlog/staged/...``, partition directories)."""

MAX_PARTITION_COLUMN_BYTES = 128
"""Longest partition column name, in bytes once escaped for a directory name: the
directory ``<name>=<value>`` must fit the 255-byte file name limit of common filesystems."""


def text_problem(value: str, *, allow_nul: bool = True) -> tuple[str, int] | None:
    """Why ``value`` cannot be stored as UTF-8 text, with the character's index; None if it can."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = value[exc.start]
        return f"a lone surrogate U+{ord(char):04X} (not encodable as UTF-8)", exc.start
    if not allow_nul and "\x00" in value:
        return "a NUL character", value.index("\x00")
    return None


def check_text(value: object, what: str, *, allow_empty: bool = True, allow_nul: bool = True) -> str:
    """``value`` if it is a string storable as UTF-8 text; InvalidTextError naming ``what``."""
    if not isinstance(value, str):
        raise InvalidTextError(
            f"{what} must be a string, got {type(value).__name__}", argument=what, reason="not a string"
        )
    problem = text_problem(value, allow_nul=allow_nul)
    if problem is not None:
        reason, position = problem
        raise InvalidTextError(
            f"{what} {preview(value)} holds {reason} at position {position}",
            argument=what,
            reason=reason,
            position=position,
        )
    if not allow_empty and not value:
        raise InvalidTextError(f"{what} must not be empty", argument=what, reason="empty")
    return value


def check_optional_text(value: object, what: str) -> str | None:
    """Like :func:`check_text`, but None passes."""
    return None if value is None else check_text(value, what)


def check_json_text(value: object, what: str) -> None:
    """Every string inside ``value`` (nested dicts, lists, tuples; keys too) is storable."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            check_text(item, what)
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def check_string_map(mapping: object, what: str) -> dict[str, str]:
    """A mapping of non-empty string keys to string values (table properties)."""
    if not isinstance(mapping, Mapping):
        raise InvalidTextError(
            f"{what}s must be a mapping of strings, got {type(mapping).__name__}",
            argument=what,
            reason="not a mapping",
        )
    out: dict[str, str] = {}
    for key, value in mapping.items():
        key = check_text(key, f"{what} key", allow_empty=False)
        out[key] = check_text(value, f"{what} {key!r} value")
    return out


def check_string_list(values: object, what: str) -> list[str]:
    """A list of non-empty strings (column names, property keys); a bare string is refused."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InvalidTextError(
            f"{what}s must be a list of strings, got {type(values).__name__}",
            argument=what,
            reason="not a list",
        )
    return [check_text(v, what, allow_empty=False) for v in values]


def check_storage_options(options: object) -> dict[str, Any]:
    """``storage_options``: None or a mapping from option names (non-empty strings) to
    values, passed to fsspec; the values are the file system's business."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise InvalidTextError(
            f"storage_options must be a dict of option names to values, got {type(options).__name__}",
            argument="storage option",
            reason="not a mapping",
        )
    return {check_text(k, "storage option", allow_empty=False): v for k, v in options.items()}


def check_app_id(app_id: object) -> str:
    """A txn app id (``txnAppId``): a non-empty string."""
    return check_text(app_id, "txn app id", allow_empty=False)


def check_txn_version(version: object, what: str = "txn version") -> int:
    """A txn version (``txnVersion``): a non-negative integer."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise InvalidTextError(
            f"{what} must be a non-negative integer, got {version!r}",
            argument=what,
            reason="not a non-negative integer",
        )
    return version


def check_uri(uri: object) -> str | os.PathLike[str]:
    """A table location: a non-empty ``str`` or ``os.PathLike``, encodable, without NUL."""
    if isinstance(uri, os.PathLike):
        path = os.fspath(uri)
        if not isinstance(path, str):
            raise InvalidTextError(
                "table URI must be a str path, not bytes", argument="table URI", reason="not a string"
            )
        check_text(path, "table URI", allow_empty=False, allow_nul=False)
        return uri
    return check_text(uri, "table URI", allow_empty=False, allow_nul=False)


def check_local_path(path: str) -> None:
    """A local table directory that fits the file system's limits: 255 bytes per name and
    :data:`MAX_LOCAL_PATH_BYTES` in all (room is left for the files inside the table)."""
    size = len(path.encode("utf-8"))
    if size > MAX_LOCAL_PATH_BYTES:
        raise InvalidTextError(
            f"table path {preview(path)} is {size} bytes long; the limit is {MAX_LOCAL_PATH_BYTES}",
            argument="table URI",
            reason="path too long",
        )
    for part in path.split(os.sep):
        size = len(part.encode("utf-8"))
        if size > MAX_PATH_COMPONENT_BYTES:
            raise InvalidTextError(
                f"table path component {preview(part)} is {size} bytes long; file systems allow "
                f"{MAX_PATH_COMPONENT_BYTES}",
                argument="table URI",
                reason="path component too long",
            )


def check_schema(schema: pa.Schema) -> None:
    """Every column name (nested ones too) non-empty and encodable; types nested at most
    :data:`MAX_TYPE_DEPTH` levels. Walks iteratively, so hostile depths cannot recurse."""
    stack: list[tuple[pa.Field, str, int]] = [(f, "", 1) for f in reversed(list(schema))]
    while stack:
        field, parent, depth = stack.pop()
        name = field.name
        what = f"column name in {parent!r}" if parent else "column name"
        check_text(name, what, allow_empty=False)
        path = f"{parent}.{name}" if parent else name
        if depth > MAX_TYPE_DEPTH:
            raise InvalidTextError(
                f"column {preview(path)} nests types {depth} levels deep; the limit is "
                f"{MAX_TYPE_DEPTH} (MAX_TYPE_DEPTH)",
                argument="schema",
                reason="nested too deeply",
            )
        _check_field_metadata(field, path)
        t = field.type
        if pa.types.is_dictionary(t) or pa.types.is_run_end_encoded(t):
            t = t.value_type
        children: list[pa.Field] = []
        if pa.types.is_struct(t):
            children = [t.field(i) for i in range(t.num_fields)]
        elif pa.types.is_map(t):
            children = [t.key_field, t.item_field]
        elif _is_list_like(t):
            children = [t.value_field]
        elif pa.types.is_union(t):
            children = [t.field(i) for i in range(t.num_fields)]
        if pa.types.is_struct(t):
            stack.extend((c, path, depth + 1) for c in reversed(children))
        else:  # list/map children have fixed names ("item", "key", "value"): check depth only
            stack.extend((pa.field("item", c.type), path, depth + 1) for c in reversed(children))


def _check_field_metadata(field: pa.Field, path: str) -> None:
    for key, value in (field.metadata or {}).items():
        for part, raw in (("key", key), ("value", value)):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                what = f"field metadata {part} of column {preview(path)}"
                raise InvalidTextError(
                    f"{what} is not valid UTF-8 (byte {exc.start})",
                    argument=what,
                    reason="not valid UTF-8",
                    position=exc.start,
                ) from None


def _is_list_like(t: pa.DataType) -> bool:
    types = pa.types
    return bool(
        types.is_list(t)
        or types.is_large_list(t)
        or types.is_fixed_size_list(t)
        or types.is_list_view(t)
        or types.is_large_list_view(t)
    )


def preview(value: str, limit: int = 60) -> str:
    """``repr`` of a value, shortened (messages stay readable for megabyte inputs)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "...'" + f" ({len(value)} chars)"


_INTERVAL_UNITS_MS = {
    "millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000,
    "week": 7 * 86_400_000,
}  # fmt: skip


def parse_interval_ms(value: str) -> int:
    """Delta's ``interval <n> <unit>`` durations (``interval 1 week``) in milliseconds, as
    table properties hold them; InvalidInputError for anything else."""
    parts = value.strip().lower().split()
    if len(parts) == 3 and parts[0] == "interval" and parts[1].isdigit():
        unit = parts[2].removesuffix("s")
        if unit in _INTERVAL_UNITS_MS:
            return int(parts[1]) * _INTERVAL_UNITS_MS[unit]
    raise InvalidInputError(f"invalid interval {value!r}; expected e.g. 'interval 7 days'")
