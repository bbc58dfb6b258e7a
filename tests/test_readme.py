"""README.md and the documentation site (every ``docs/**/*.md`` page) are a contract: every
fenced block in them is run, or checked, here, by the same rules on every page.

A block's fence info string says what it is:

* ``python``: run. The blocks of one ``##`` section of a page (its ``###`` subsections
  included; a page's ``#`` title is a section too) run in order in one namespace, as a
  reader pasting them one after another would: a table created in one block is used in the
  next. Sections do not share names, not even on one page. Each section is one test,
  ``test_python_section[<page>#<the heading's anchor>]``, run in a fresh temporary directory
  (also the working directory). Absolute example locations are rewritten into it:
  string literals starting with ``/`` (``"/data/events"``) become local directories.
  Object-store URIs (``"s3://bucket/events"``) go to a fresh bucket on the suite's S3
  server (moto, on loopback), whose endpoint and fake credentials the section's process
  finds in the usual AWS environment variables. ``zk://[user:password@]hosts/chroot``
  specs point at the suite's ZooKeeper server under a fresh chroot. Names a section uses
  without defining them come from here, and only these: ``spark`` (the suite's one
  SparkSession); in sections that use an object store ``ENDPOINT``, ``KEY`` and
  ``SECRET`` (what Spark's workers, which do not share the driver's environment, are
  given as options); and for the ZooKeeper section ``batch`` and the existing table it
  opens (:data:`ZK_TABLE`, created beforehand).

  A trailing comment ``# -> value`` on an expression statement makes it a check: the
  expression must equal ``value`` (a Python expression, evaluated in the section's
  namespace). A ``# ->`` comment anywhere else, or one that never runs, fails the test.
* ``bash``: not run. Every command must exist: ``./scripts/...`` an executable file,
  ``python -m module ...`` a module whose ``main`` accepts exactly these arguments (they
  are parsed, nothing runs), any other command on ``PATH`` or in the venv.
* ``text``: output, layouts and other text that is not code; not run.
* ``mermaid``: a diagram (the site draws it); not run.

Any other info string, or none, fails ``test_every_block_is_run_or_marked``.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import importlib
import inspect
import io
import os
import re
import shlex
import shutil
import sys
import tokenize
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

RUN, COMMANDS, NOT_RUN, DIAGRAM = "python", "bash", "text", "mermaid"

#: The table the ZooKeeper section opens; the test creates it first.
ZK_TABLE = "s3://bucket/events"

_FENCE = re.compile(r"^( *)```(.*)$")  # indented: a block inside a list item
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")
_CHECK = "# ->"
# A string literal holding an absolute path ("/data/events"), or an object-store URI.
_ABS_PATH = re.compile(r"""(?<=["'])/(?=[\w.-])""")
_OBJECT_STORE = re.compile(r"""(?<=["'])(s3a?|gs|gcs|abfss?|az)://[^/"']+""")
# zk://[user:password@]host:port[,host:port...][/chroot]
_ZK_SPEC = re.compile(r"""zk://(?P<auth>[^@/"'\s]+@)?(?P<hosts>[^/"'?\s]+)(?P<chroot>/[^"'?\s]*)?""")
_URL = re.compile(r"^([a-z][a-z0-9+.-]*)://")


@dataclass(frozen=True)
class Block:
    kind: str  # the fence info string
    line: int  # the page line of the block's first line of code
    code: str
    section: str  # the enclosing ``##`` heading
    heading: str  # the innermost heading
    page: str = "README.md"  # the file, relative to the repository

    def where(self) -> str:
        return f"{self.page}:{self.line} (under {self.heading!r})"


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: ``Many machines: version slots`` -> ``many-machines-version-slots``."""
    text = re.sub(r"[^\w\- ]", "", heading.lower())
    return text.replace(" ", "-")


def pages() -> list[Path]:
    """README.md, then every page of the site, in path order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def page_name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def readme_blocks(text: str | None = None, page: str = "README.md") -> list[Block]:
    """Every fenced block of a page (the README unless ``text`` is given), with the headings
    it sits under."""
    lines = ((ROOT / page).read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks: list[Block] = []
    section = heading = ""
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            title = _HEADING.match(lines[i])
            if title is not None:
                heading = title.group(2)
                if len(title.group(1)) <= 2:
                    section = heading
            i += 1
            continue
        indent = fence.group(1)
        start = i + 1
        end = start
        while end < len(lines) and lines[end].rstrip() != f"{indent}```":
            end += 1
        assert end < len(lines), f"{page}:{i + 1}: unclosed code fence"
        code = "\n".join(line.removeprefix(indent) for line in lines[start:end]) + "\n"
        blocks.append(Block(fence.group(2).strip(), start + 1, code, section, heading, page))
        i = end + 1
    return blocks


BLOCKS = [block for path in pages() for block in readme_blocks(page=page_name(path))]


def _sections() -> dict[str, list[Block]]:
    """The python blocks of each section, keyed by ``<page>#<the section's anchor>``."""
    out: dict[str, list[Block]] = {}
    for block in BLOCKS:
        if block.kind == RUN:
            key = f"{block.page}#{anchor(block.section)}"
            blocks = out.setdefault(key, [])
            assert not blocks or blocks[0].section == block.section, (
                f"{block.where()}: two sections named {key}"
            )
            blocks.append(block)
    return out


SECTIONS = _sections()


def _uses_spark(blocks: list[Block]) -> bool:
    for block in blocks:
        for node in ast.walk(ast.parse(block.code)):
            if isinstance(node, ast.Name) and node.id == "spark":
                return True
    return False


def _uses_zookeeper(blocks: list[Block]) -> bool:
    return any("zk://" in block.code for block in blocks)


def _uses_object_store(blocks: list[Block]) -> bool:
    return any(_OBJECT_STORE.search(block.code) for block in blocks)


def _section_params() -> Iterator[Any]:
    for key, blocks in SECTIONS.items():
        marks = []
        if _uses_spark(blocks):
            marks += [pytest.mark.spark, pytest.mark.timeout(300)]
        if _uses_zookeeper(blocks):
            marks += [pytest.mark.zookeeper, pytest.mark.timeout(300)]
        yield pytest.param(key, id=key, marks=marks)


# --------------------------------------------------------------------------- the catalogue


def test_every_block_is_run_or_marked() -> None:
    kinds = (RUN, COMMANDS, NOT_RUN, DIAGRAM)
    unknown = [f"{b.where()}: info string {b.kind!r}" for b in BLOCKS if b.kind not in kinds]
    assert not unknown, (
        f"mark each block ```{RUN} (run), ```{COMMANDS} (commands checked), ```{NOT_RUN} (not run) "
        f"or ```{DIAGRAM} (a diagram): " + "; ".join(unknown)
    )
    assert any(key.startswith("README.md#") for key in SECTIONS), "the README has no python block"
    assert any(key.startswith("docs/") for key in SECTIONS), "the site has no python block"
    for block in BLOCKS:
        if block.kind == RUN:
            compile(block.code, block.where(), "exec")  # a syntax error names its README line


def test_readme_parser_follows_sections() -> None:
    text = (
        "# T\n\n## A: one\n\n```python\nx = 1\n```\n\n### B\n\n```text\nout\n```\n\n## C\n```bash\nls\n```\n"
    )
    blocks = readme_blocks(text, page="docs/p.md")
    assert [(b.kind, b.line, b.code, b.section, b.heading, b.page) for b in blocks] == [
        ("python", 6, "x = 1\n", "A: one", "A: one", "docs/p.md"),
        ("text", 12, "out\n", "A: one", "B", "docs/p.md"),
        ("bash", 17, "ls\n", "C", "C", "docs/p.md"),
    ]
    assert blocks[0].where() == "docs/p.md:6 (under 'A: one')"
    assert anchor("Many machines: version slots in ZooKeeper") == "many-machines-version-slots-in-zookeeper"


# --------------------------------------------------------------------------- python blocks


class Rewriter:
    """Points the README's example locations at a temporary directory and the test ZooKeeper."""

    def __init__(self, tmp: Path, zk_hosts: str | None, bucket: str | None = None) -> None:
        self.tmp = str(tmp)
        self.zk_hosts = zk_hosts
        self.bucket = bucket  # the S3 bucket object-store URIs go to
        self.zk_root = f"/readme-{uuid.uuid4().hex[:12]}"
        self.zk_specs: set[str] = set()
        self.zk_chroots: set[str] = set()
        self.zk_auth: set[str] = set()

    def __call__(self, code: str) -> str:
        code = _ABS_PATH.sub(self.tmp + "/", code)
        code = _OBJECT_STORE.sub(self._object_store, code)
        return _ZK_SPEC.sub(self._zk, code)

    def _object_store(self, match: re.Match[str]) -> str:
        assert self.bucket is not None, "an object-store URI in a section not given an S3 bucket"
        assert match.group(1) == "s3", f"only s3:// examples run (the suite's server is S3): {match.group(0)}"
        return f"s3://{self.bucket}"

    def uri(self, literal: str) -> str:
        """A location as the README's code sees it once rewritten."""
        return str(ast.literal_eval(self(repr(literal))))

    def _zk(self, match: re.Match[str]) -> str:
        assert self.zk_hosts is not None, "a zk:// spec in a section not marked for ZooKeeper"
        auth = match.group("auth") or ""
        if auth:
            self.zk_auth.add(auth[:-1])
        spec = f"zk://{auth}{self.zk_hosts}{self.zk_root}{match.group('chroot') or ''}"
        self.zk_specs.add(spec)
        self.zk_chroots.add(self.zk_root + (match.group("chroot") or ""))
        return spec

    def check_local(self, tree: ast.AST, block: Block) -> None:
        """No absolute path or remote URI escaped the rewriting."""
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            value = node.value
            if value.startswith("/"):
                assert value.startswith(self.tmp), f"{block.where()}: path {value!r} was not rewritten"
            scheme = _URL.match(value)
            if scheme is not None:
                # spark:// is a cluster master's address, not a place data is kept.
                on_test_bucket = self.bucket is not None and value.startswith(f"s3://{self.bucket}/")
                assert on_test_bucket or scheme.group(1) in ("zk", "memory", "file", "spark", "http"), (
                    f"{block.where()}: URI {value!r} was not rewritten"
                )


class Checks:
    """The ``# -> value`` checks of one section: which exist, which ran."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.namespace = namespace
        self.expected: dict[int, str] = {}  # page line -> expected-value source
        self.page = "README.md"  # the page of the block being run
        self.ran: set[int] = set()

    def instrument(self, block: Block, code: str) -> ast.Module:
        """The block's AST, with README line numbers, each checked statement replaced by a call
        of :meth:`check`."""
        expectations: dict[int, str] = {}
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.COMMENT and tok.string.startswith(_CHECK):
                text = tok.string[len(_CHECK) :].strip()
                line = block.line + tok.start[0] - 1
                try:
                    ast.parse(text, mode="eval")
                except SyntaxError:
                    pytest.fail(
                        f"{block.page}:{line}: `{tok.string}` is not a Python expression", pytrace=False
                    )
                expectations[line] = text
        tree = ast.parse(code, filename=str(ROOT / block.page))
        ast.increment_lineno(tree, block.line - 1)
        checks = self

        class Instrument(ast.NodeTransformer):
            def visit_Expr(self, node: ast.Expr) -> ast.AST:
                expected = expectations.pop(node.end_lineno or node.lineno, None)
                if expected is None:
                    return node
                checks.expected[node.lineno] = expected
                call = ast.Call(
                    func=ast.Name("__readme_check__", ast.Load()),
                    args=[
                        node.value,
                        ast.Constant(node.lineno),
                        ast.Constant(ast.get_source_segment(code, _shifted(node, block)) or ""),
                        ast.Constant(expected),
                    ],
                    keywords=[],
                )
                return ast.copy_location(ast.Expr(call), node)

        tree = ast.fix_missing_locations(Instrument().visit(tree))
        assert not expectations, (
            f"`{_CHECK}` comments not on an expression statement, {block.page} lines {sorted(expectations)}"
        )
        return tree

    def check(self, actual: Any, line: int, source: str, expected_src: str) -> None:
        self.ran.add(line)
        expected = eval(expected_src, self.namespace)
        assert actual == expected, (
            f"{self.page}:{line}: `{source}` is {actual!r}, the page says {expected_src}"
        )

    def all_ran(self) -> None:
        missed = sorted(set(self.expected) - self.ran)
        assert not missed, f"`{_CHECK}` checks that never ran, {self.page} lines {missed}"


def _shifted(node: ast.AST, block: Block) -> ast.AST:
    """A copy of ``node``'s position relative to the block (for get_source_segment)."""
    copy = ast.Expr(ast.Constant(None))
    copy.lineno = node.lineno - block.line + 1
    copy.end_lineno = (node.end_lineno or node.lineno) - block.line + 1
    copy.col_offset = node.col_offset
    copy.end_col_offset = node.end_col_offset
    return copy


def run_section(blocks: list[Block], namespace: dict[str, Any], rewrite: Rewriter) -> None:
    """Run ``blocks`` in order in ``namespace``, checking every ``# -> value``."""
    checks = Checks(namespace)
    namespace["__readme_check__"] = checks.check
    for block in blocks:
        checks.page = block.page
        code = rewrite(block.code)
        assert code.count("\n") == block.code.count("\n"), "rewriting must keep line numbers"
        tree = checks.instrument(block, code)
        rewrite.check_local(tree, block)
        exec(compile(tree, str(ROOT / block.page), "exec"), namespace)
    checks.all_ran()


def _zookeeper_given(rewrite: Rewriter, blocks: list[Block]) -> dict[str, Any]:
    """The ZooKeeper section opens an existing table and appends ``batch`` to it."""
    import pyarrow as pa

    from eventlog import Table
    from lockstore import InMemorySlotStore

    assert any(ZK_TABLE in b.code for b in blocks), f"the ZooKeeper section no longer opens {ZK_TABLE}"
    schema = pa.schema([("id", pa.int64()), ("date", pa.string()), ("x", pa.int64())])
    # Created through another slot store (a one-process one): the section's writers then
    # claim the versions after it in ZooKeeper, as writers joining a table do.
    Table.create(rewrite.uri(ZK_TABLE), schema, partition_by=["date"], slots=InMemorySlotStore()).close()
    return {"batch": pa.table({"id": [1], "date": ["2024-01-01"], "x": [5]}, schema=schema)}


def _zookeeper_cleanup(rewrite: Rewriter, namespace: dict[str, Any], ran: bool) -> None:
    """Close the section's tables, which must close its ZooKeeper connections (as the README
    says); check that the section really used ZooKeeper; delete its znodes."""
    import gc

    from kazoo.client import KazooClient
    from kazoo.exceptions import NoNodeError, NotEmptyError

    from eventlog import Table
    from lockstore.registry import shared_slot_stores

    _close_tables(namespace, Table)
    gc.collect()
    still_open = [s for s in shared_slot_stores() if getattr(s, "chroot", "").startswith(rewrite.zk_root)]
    for store in still_open:
        store.close()
    assert rewrite.zk_hosts is not None
    auth = [("digest", credentials) for credentials in sorted(rewrite.zk_auth)]
    client = KazooClient(hosts=rewrite.zk_hosts, auth_data=auth or None, timeout=10)
    client.start(timeout=30)
    try:
        if ran:
            assert not still_open, "closing the README's tables left their ZooKeeper store open"
            tables = [f"{chroot}/tables" for chroot in sorted(rewrite.zk_chroots)]
            assert tables, "the ZooKeeper section names no zk:// spec"
            assert any(client.exists(path) and client.get_children(path) for path in tables), (
                f"no table was bound in ZooKeeper under {tables}"
            )
        for attempt in range(5):
            try:
                client.delete(rewrite.zk_root, recursive=True)
                break
            except NoNodeError:
                break
            except NotEmptyError:
                if attempt == 4:
                    raise
    finally:
        client.stop()
        client.close()


def _close_tables(namespace: dict[str, Any], table_class: type) -> None:
    """Close every table in ``namespace``, then forget the namespace (nothing refers to the
    tables any more, so an unclosed one would be collected)."""
    for value in namespace.values():
        if isinstance(value, table_class):
            value.close()
    namespace.clear()


@pytest.mark.parametrize("section", list(_section_params()))
def test_python_section(
    section: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    blocks = SECTIONS[section]
    zookeeper = _uses_zookeeper(blocks)
    namespace: dict[str, Any] = {"__name__": "__readme__", "__builtins__": builtins}
    bucket = None
    if _uses_object_store(blocks):
        from tests.support.s3server import ACCESS_KEY, SECRET_KEY

        endpoint = request.getfixturevalue("s3_server")
        bucket = request.getfixturevalue("s3_bucket")  # also sets fake AWS credentials
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        namespace.update(ENDPOINT=endpoint, KEY=ACCESS_KEY, SECRET=SECRET_KEY)
    rewrite = Rewriter(tmp_path, request.getfixturevalue("zk_hosts") if zookeeper else None, bucket)
    if _uses_spark(blocks):
        # Before chdir: the session's JVM (and its Python workers, which must find the
        # top-level module pyspark_eventlog) keeps the directory it was started in.
        namespace["spark"] = request.getfixturevalue("spark")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EVENTLOG_SLOTS", raising=False)
    ran = False
    try:
        if zookeeper:
            namespace.update(_zookeeper_given(rewrite, blocks))
        run_section(blocks, namespace, rewrite)
        ran = True
    finally:
        if zookeeper:
            _zookeeper_cleanup(rewrite, namespace, ran)


def test_checks_catch_a_wrong_result(tmp_path: Path) -> None:
    """The ``# -> value`` machinery itself: a wrong value fails, a check that never runs fails,
    a ``# ->`` comment that checks nothing fails, and locations are rewritten."""
    rewrite = Rewriter(tmp_path, None)

    def section(code: str) -> list[Block]:
        return [Block(RUN, 10, code, "S", "S")]

    namespace: dict[str, Any] = {}
    run_section(section('x = 2\nx + 1  # -> 3\npath = "/data/t"\n'), namespace, rewrite)
    assert namespace["path"] == f"{tmp_path}/data/t"
    with pytest.raises(AssertionError, match=r"README.md:11: `x \+ 1` is 3, the page says 4"):
        run_section(section("x = 2\nx + 1  # -> 4\n"), {}, rewrite)
    with pytest.raises(AssertionError, match=r"never ran, README.md lines \[12\]"):
        run_section(section("if False:\n    pass\n    1  # -> 1\n"), {}, rewrite)
    with pytest.raises(AssertionError, match="not on an expression statement"):
        run_section(section("x = 1  # -> 1\n"), {}, rewrite)
    with pytest.raises(ZeroDivisionError):
        run_section(section("1 / 0\n"), {}, rewrite)
    assert (
        Rewriter(tmp_path, None, "b-1")('Table.open("s3://bucket/events")') == 'Table.open("s3://b-1/events")'
    )


# --------------------------------------------------------------------------- shell blocks


class _Parsed(Exception):
    """Raised instead of running a CLI once its arguments parsed."""


def _parses(module_name: str, argv: list[str]) -> str | None:
    """None if ``python -m module_name *argv`` is accepted by the module's ``main``, else why not."""
    module = importlib.import_module(module_name)
    main: Callable[[list[str]], Any] | None = getattr(module, "main", None)
    if main is None:
        return f"{module_name} has no main()"
    if "parse_only" in inspect.signature(main).parameters:  # eventlog.cli (typer): runs nothing
        code = main(argv, parse_only=True)  # type: ignore[call-arg]
        return None if code == 0 else f"its argument parser exits with {code}"
    original = argparse.ArgumentParser.parse_args

    def parse_only(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        original(self, args, namespace)
        raise _Parsed

    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_only):
        try:
            main(argv)
        except _Parsed:
            return None
        except SystemExit as exc:
            return f"its argument parser exits with {exc.code}"
    return f"{module_name}.main() parsed no arguments"


def _command_problem(words: list[str]) -> str | None:
    command = words[0]
    if "/" in command:
        path = (ROOT / command).resolve()
        if not path.is_file():
            return f"{command} does not exist"
        if not os.access(path, os.X_OK):
            return f"{command} is not executable"
        return None
    if command in ("python", "python3") and len(words) >= 3 and words[1] == "-m":
        return _parses(words[2], words[3:])
    if shutil.which(command) or (Path(sys.executable).parent / command).exists():
        return None
    return f"command {command!r} not found"


def _shell_params() -> Iterator[Any]:
    seen: dict[str, int] = {}
    for block in BLOCKS:
        if block.kind == COMMANDS:
            name = f"{block.page}#{anchor(block.heading)}"
            seen[name] = seen.get(name, 0) + 1
            yield pytest.param(block, id=name if seen[name] == 1 else f"{name}-{seen[name]}")


@pytest.mark.parametrize("block", list(_shell_params()))
def test_shell_block_commands_exist(block: Block, capsys: pytest.CaptureFixture[str]) -> None:
    problems = []
    for offset, line in enumerate(block.code.splitlines()):
        words = shlex.split(line, comments=True)
        if words:
            problem = _command_problem(words)
            if problem is not None:
                err = capsys.readouterr().err.strip()
                problems.append(
                    f"{block.page}:{block.line + offset}: {line.strip()!r}: {problem} {err}".strip()
                )
    assert not problems, "\n".join(problems)


def test_command_checks_catch_bad_commands() -> None:
    assert _command_problem(["./scripts/test.sh"]) is None
    assert _command_problem(["./scripts/no-such.sh"]) == "./scripts/no-such.sh does not exist"
    assert _command_problem(["python", "-m", "eventlog.cli", "slots", "repair", "/t", "--dry-run"]) is None
    assert _command_problem(["python", "-m", "eventlog.cli", "slots", "repair", "/t", "--dryrun"]) is not None
    assert _command_problem(["no-such-command-here"]) == "command 'no-such-command-here' not found"
