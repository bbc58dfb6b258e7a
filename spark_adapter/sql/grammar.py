"""The statements sqlglot leaves opaque, parsed by a small grammar of our own.

sqlglot (Spark dialect) gives structured trees for SELECT, INSERT, UPDATE, DELETE, MERGE,
CREATE TABLE and most of ALTER TABLE (:mod:`spark_adapter.sql.statements`). Delta's
maintenance statements come back from it as an opaque ``Command`` or fail to parse, so they
are read here, from sqlglot's tokens (Spark dialect: quoting, strings and comments as Spark
reads them):

* ``OPTIMIZE table [WHERE predicate] [ZORDER BY (col, ...)]``
* ``REORG TABLE table [WHERE predicate] APPLY (PURGE)``
* ``VACUUM table [RETAIN n HOURS] [DRY RUN]``
* ``RESTORE [TABLE] table [TO] VERSION|TIMESTAMP AS OF value``
* ``DESCRIBE HISTORY table [LIMIT n]``, ``DESCRIBE DETAIL table``
* ``SHOW TBLPROPERTIES table [(key)]``
* ``ALTER TABLE table UNSET TBLPROPERTIES [IF EXISTS] (key, ...)``
* ``ALTER TABLE table DROP FEATURE name [TRUNCATE HISTORY]``
* ``ALTER TABLE table CLUSTER BY NONE`` (sqlglot parses only ``CLUSTER BY (col, ...)``)

A table is a path (``eventlog.`/path```, ``delta.`/path``` too, as Delta users write it)
or a name. Predicates are kept as the statement's own text, for Spark to evaluate. A
statement that starts like one of these but does not follow the grammar raises
:class:`~spark_adapter.errors.UnsupportedStatementError` naming where it goes wrong.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

from sqlglot.dialects.spark import Spark
from sqlglot.errors import TokenError
from sqlglot.tokenizer_core import Token, TokenType

from spark_adapter.errors import UnsupportedStatementError

__all__ = [
    "DescribeDetail",
    "DescribeHistory",
    "DropFeature",
    "Maintenance",
    "Optimize",
    "Reorg",
    "Restore",
    "ShowProperties",
    "TableName",
    "UnsetProperties",
    "Vacuum",
    "parse_maintenance",
]

PATH_CATALOGS = ("eventlog", "delta")
"""``<catalog>.`/path``` names a table by its location."""


@dataclasses.dataclass(frozen=True)
class TableName:
    """A table in a statement: ``path`` for ``eventlog.`/path```, else ``name`` (a catalog
    table, possibly qualified ``db.name``)."""

    path: str | None = None
    name: str | None = None

    def __str__(self) -> str:
        return f"eventlog.`{self.path}`" if self.path is not None else str(self.name)


@dataclasses.dataclass(frozen=True)
class Optimize:
    table: TableName
    where: str | None
    zorder_by: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Reorg:
    table: TableName
    where: str | None


@dataclasses.dataclass(frozen=True)
class Vacuum:
    table: TableName
    retain_hours: float | None
    dry_run: bool


@dataclasses.dataclass(frozen=True)
class Restore:
    table: TableName
    version: int | None
    timestamp: str | None


@dataclasses.dataclass(frozen=True)
class DescribeHistory:
    table: TableName
    limit: int | None


@dataclasses.dataclass(frozen=True)
class DescribeDetail:
    table: TableName


@dataclasses.dataclass(frozen=True)
class ShowProperties:
    table: TableName
    key: str | None


@dataclasses.dataclass(frozen=True)
class UnsetProperties:
    table: TableName
    keys: tuple[str, ...]
    if_exists: bool


@dataclasses.dataclass(frozen=True)
class DropFeature:
    table: TableName
    feature: str
    truncate_history: bool


@dataclasses.dataclass(frozen=True)
class ClusterByNone:
    table: TableName


Maintenance = (
    Optimize
    | Reorg
    | Vacuum
    | Restore
    | DescribeHistory
    | DescribeDetail
    | ShowProperties
    | UnsetProperties
    | DropFeature
    | ClusterByNone
)


class _Tokenizer(Spark.Tokenizer):  # type: ignore[misc]
    """Spark's tokens, except that no statement is swallowed whole as a ``COMMAND``."""

    COMMANDS: ClassVar[set[TokenType]] = set()


class _Parser:
    """Recursive descent over one statement's tokens."""

    def __init__(self, text: str, tokens: Sequence[Token]) -> None:
        self.text = text
        self.tokens = [t for t in tokens if t.token_type != TokenType.SEMICOLON]
        self.i = 0
        self.statement = text.strip()

    # ------------------------------------------------------------------ tokens

    def _peek(self, offset: int = 0) -> Token | None:
        j = self.i + offset
        return self.tokens[j] if j < len(self.tokens) else None

    def _word(self, offset: int = 0) -> str:
        """The upper-cased text of a token that is a keyword or a plain word ("" if none)."""
        tok = self._peek(offset)
        if tok is None or tok.token_type in (TokenType.STRING, TokenType.NUMBER):
            return ""
        if tok.token_type in (TokenType.IDENTIFIER,) and self._quoted(tok):
            return ""
        return " ".join(tok.text.upper().split())  # one token for some keyword pairs: "CLUSTER BY"

    def _quoted(self, tok: Token) -> bool:
        return self.text[tok.start : tok.start + 1] == "`"

    def at(self, *words: str) -> bool:
        return all(self._word(k) == w for k, w in enumerate(words))

    def accept(self, *words: str) -> bool:
        if self.at(*words):
            self.i += len(words)
            return True
        return False

    def expect(self, *words: str) -> None:
        if not self.accept(*words):
            self.fail(f"expected {' '.join(words)}")

    def done(self) -> bool:
        return self.i >= len(self.tokens)

    def fail(self, what: str) -> UnsupportedStatementError:
        tok = self._peek()
        where = f"at {self.text[tok.start :][:40]!r}" if tok is not None else "at the end"
        raise UnsupportedStatementError(self.statement, f"{what} {where}")

    def end(self) -> None:
        if not self.done():
            self.fail("unexpected text")

    # ------------------------------------------------------------------ pieces

    def table(self) -> TableName:
        """``catalog.`/path``` or a (possibly qualified) name."""
        parts: list[tuple[str, bool]] = []
        while True:
            tok = self._peek()
            if tok is None or (
                tok.token_type not in (TokenType.VAR, TokenType.IDENTIFIER) and not tok.text.isidentifier()
            ):
                self.fail("expected a table name")
            assert tok is not None
            parts.append((tok.text, self._quoted(tok)))
            self.i += 1
            nxt = self._peek()
            if nxt is None or nxt.token_type != TokenType.DOT:
                break
            self.i += 1
        if len(parts) == 2 and parts[0][0].lower() in PATH_CATALOGS and parts[1][1]:
            return TableName(path=parts[1][0])
        return TableName(name=".".join(p for p, _ in parts))

    def _literal(self, kind: TokenType, what: str, shape: str) -> str:
        """The text of the next token, which must be of ``kind`` (``shape`` describes it)."""
        tok = self._peek()
        if tok is None or tok.token_type != kind or (shape == "a whole number" and not tok.text.isdigit()):
            self.fail(f"expected {what} ({shape})")
        assert tok is not None
        self.i += 1
        return str(tok.text)

    def integer(self, what: str) -> int:
        return int(self._literal(TokenType.NUMBER, what, "a whole number"))

    def number(self, what: str) -> float:
        return float(self._literal(TokenType.NUMBER, what, "a number"))

    def string(self, what: str) -> str:
        return self._literal(TokenType.STRING, what, "a quoted string")

    def name(self, what: str) -> str:
        tok = self._peek()
        if tok is None or tok.token_type in (TokenType.STRING, TokenType.NUMBER, TokenType.L_PAREN):
            self.fail(f"expected {what}")
        assert tok is not None
        self.i += 1
        return tok.text

    def names_in_parens(self, what: str, *, strings: bool = False) -> tuple[str, ...]:
        self.expect_token(TokenType.L_PAREN, "(")
        out = [self.string(what) if strings else self.name(what)]
        while self._peek() is not None and self._peek().token_type == TokenType.COMMA:  # type: ignore[union-attr]
            self.i += 1
            out.append(self.string(what) if strings else self.name(what))
        self.expect_token(TokenType.R_PAREN, ")")
        return tuple(out)

    def expect_token(self, kind: TokenType, text: str) -> None:
        tok = self._peek()
        if tok is None or tok.token_type != kind:
            self.fail(f"expected {text!r}")
        self.i += 1

    def text_until(self, *stops: tuple[str, ...]) -> str:
        """The statement's own text from here to the first of ``stops`` (keyword sequences)
        at parenthesis depth 0, or to the end; at least one token."""
        start = self.i
        depth = 0
        while not self.done():
            tok = self._peek()
            assert tok is not None
            if tok.token_type == TokenType.L_PAREN:
                depth += 1
            elif tok.token_type == TokenType.R_PAREN:
                depth -= 1
            elif depth == 0 and any(self.at(*stop) for stop in stops):
                break
            self.i += 1
        if self.i == start:
            self.fail("expected a predicate")
        first, last = self.tokens[start], self.tokens[self.i - 1]
        return self.text[first.start : last.end + 1]

    # ------------------------------------------------------------------ statements

    def optimize(self) -> Optimize:
        table = self.table()
        where = self.text_until(("ZORDER", "BY")) if self.accept("WHERE") else None
        zorder: tuple[str, ...] = ()
        if self.accept("ZORDER", "BY"):
            if self._peek() is not None and self._peek().token_type == TokenType.L_PAREN:  # type: ignore[union-attr]
                zorder = self.names_in_parens("a column")
            else:
                zorder = (self.name("a column"),)
        self.end()
        return Optimize(table, where, zorder)

    def reorg(self) -> Reorg:
        self.expect("TABLE")
        table = self.table()
        where = self.text_until(("APPLY",)) if self.accept("WHERE") else None
        self.expect("APPLY")
        self.expect_token(TokenType.L_PAREN, "(")
        if not self.accept("PURGE"):
            self.fail("only APPLY (PURGE) is supported")
        self.expect_token(TokenType.R_PAREN, ")")
        self.end()
        return Reorg(table, where)

    def vacuum(self) -> Vacuum:
        table = self.table()
        hours = None
        if self.accept("RETAIN"):
            hours = self.number("the retention")
            self.expect("HOURS")
        dry_run = self.accept("DRY", "RUN")
        self.end()
        return Vacuum(table, hours, dry_run)

    def restore(self) -> Restore:
        self.accept("TABLE")
        table = self.table()
        self.accept("TO")
        if self.accept("VERSION", "AS", "OF"):
            version = self.integer("a version")
            self.end()
            return Restore(table, version, None)
        self.expect("TIMESTAMP", "AS", "OF")
        timestamp = self.string("a timestamp")
        self.end()
        return Restore(table, None, timestamp)

    def describe(self) -> DescribeHistory | DescribeDetail:
        if self.accept("HISTORY"):
            table = self.table()
            limit = self.integer("a row count") if self.accept("LIMIT") else None
            self.end()
            return DescribeHistory(table, limit)
        self.expect("DETAIL")
        table = self.table()
        self.end()
        return DescribeDetail(table)

    def show(self) -> ShowProperties:
        self.expect("TBLPROPERTIES")
        table = self.table()
        key = None
        if not self.done():
            self.expect_token(TokenType.L_PAREN, "(")
            tok = self._peek()
            key = (
                self.string("a property")
                if tok is not None and tok.token_type == TokenType.STRING
                else self.dotted()
            )
            self.expect_token(TokenType.R_PAREN, ")")
        self.end()
        return ShowProperties(table, key)

    def dotted(self) -> str:
        """An unquoted property key such as ``delta.appendOnly``."""
        parts = [self.name("a property")]
        while self._peek() is not None and self._peek().token_type == TokenType.DOT:  # type: ignore[union-attr]
            self.i += 1
            parts.append(self.name("a property"))
        return ".".join(parts)

    def alter(self) -> UnsetProperties | DropFeature | ClusterByNone:
        self.expect("TABLE")
        table = self.table()
        if self.accept("CLUSTER BY", "NONE"):
            self.end()
            return ClusterByNone(table)
        if self.accept("UNSET", "TBLPROPERTIES"):
            if_exists = self.accept("IF", "EXISTS")
            self.expect_token(TokenType.L_PAREN, "(")
            keys = [self._key()]
            while self._peek() is not None and self._peek().token_type == TokenType.COMMA:  # type: ignore[union-attr]
                self.i += 1
                keys.append(self._key())
            self.expect_token(TokenType.R_PAREN, ")")
            self.end()
            return UnsetProperties(table, tuple(keys), if_exists)
        self.expect("DROP", "FEATURE")
        tok = self._peek()
        feature = (
            self.string("a feature")
            if tok is not None and tok.token_type == TokenType.STRING
            else self.name("a feature")
        )
        truncate = self.accept("TRUNCATE", "HISTORY")
        self.end()
        return DropFeature(table, feature, truncate)

    def _key(self) -> str:
        tok = self._peek()
        return (
            self.string("a property")
            if tok is not None and tok.token_type == TokenType.STRING
            else self.dotted()
        )


def parse_maintenance(text: str) -> Maintenance | None:
    """The statement ``text`` if it is one of this grammar's (see the module docstring),
    else None. Raises :class:`UnsupportedStatementError` when it starts like one but does
    not follow the grammar."""
    try:
        tokens = _Tokenizer().tokenize(text)
    except TokenError:
        return None  # not ours to judge: Spark reports it
    parser = _Parser(text, tokens)
    if parser.accept("OPTIMIZE"):
        return parser.optimize()
    if parser.accept("REORG"):
        return parser.reorg()
    if parser.accept("VACUUM"):
        return parser.vacuum()
    if parser.accept("RESTORE"):
        return parser.restore()
    if parser.at("DESCRIBE", "HISTORY") or parser.at("DESCRIBE", "DETAIL"):
        parser.accept("DESCRIBE")
        return parser.describe()
    if parser.accept("SHOW", "TBLPROPERTIES"):
        parser.i -= 1
        return parser.show()
    if parser.at("ALTER", "TABLE") and _alter_is_ours(parser):
        parser.accept("ALTER")
        return parser.alter()
    return None


def _alter_is_ours(parser: _Parser) -> bool:
    """Whether an ALTER TABLE is UNSET TBLPROPERTIES, DROP FEATURE or CLUSTER BY NONE
    (sqlglot's otherwise)."""
    words = [parser._word(k) for k in range(len(parser.tokens))]
    return "UNSET" in words or "FEATURE" in words or words[-2:] == ["CLUSTER BY", "NONE"]
