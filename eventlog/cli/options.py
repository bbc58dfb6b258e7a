"""The global options of the ``eventlog`` program, and the state of one run.

Global options (``--slots``, ``--storage-option``, ``--log-level``, ``--json``,
``--debug``) are accepted before the subcommand (``eventlog --json history URI``) and
after it (``eventlog history URI --json``): :func:`with_global_options` adds them to every
subcommand's signature, so typer parses them there too. A value given after the
subcommand wins; ``--storage-option`` values from both places are merged.
"""

from __future__ import annotations

import enum
import functools
import inspect
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.logging import RichHandler

from eventlog.errors import TableNotFoundError
from eventlog.table import Table

GLOBAL_PANEL = "Global options"
LOGGERS = ("eventlog", "lockstore")


class LogLevel(enum.StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"
    critical = "critical"


def _check_storage_options(values: list[str] | None) -> list[str] | None:
    for value in values or []:
        parse_storage_option(value)
    return values


def parse_storage_option(value: str) -> tuple[str, str]:
    """``KEY=VALUE`` as a pair; typer.BadParameter (exit 2) for anything else."""
    key, sep, item = value.partition("=")
    if not sep or not key.strip():
        raise typer.BadParameter(f"expected KEY=VALUE, got {value!r}", param_hint="'--storage-option'")
    return key.strip(), item


AcceptLostOption = Annotated[
    list[int] | None,
    typer.Option(
        "--accept-lost",
        metavar="VERSION",
        min=0,
        help="The version of an acknowledged commit whose loss is accepted (repeatable): slots "
        "repair records the loss in a REPAIR commit; verify then notes it instead of failing.",
        show_default=False,
    ),
]
SlotsOption = Annotated[
    str | None,
    typer.Option(
        "--slots",
        metavar="SPEC",
        help="Slot store spec (zk://host:2181/root, memory://, file:///dir); default: "
        "$EVENTLOG_SLOTS, else the table's embedded store.",
        rich_help_panel=GLOBAL_PANEL,
        show_default=False,
    ),
]
StorageOption = Annotated[
    list[str] | None,
    typer.Option(
        "--storage-option",
        metavar="KEY=VALUE",
        help="A file-system option for the table's storage, passed to fsspec as a string "
        "(repeatable): e.g. endpoint_url=http://host:9000 for S3.",
        callback=_check_storage_options,
        rich_help_panel=GLOBAL_PANEL,
        show_default=False,
    ),
]
LogLevelOption = Annotated[
    LogLevel | None,
    typer.Option(
        "--log-level",
        case_sensitive=False,
        help="Log messages of this level and above to stderr [default: warning].",
        rich_help_panel=GLOBAL_PANEL,
        show_default=False,
    ),
]
DurableOption = Annotated[
    bool,
    typer.Option(
        "--durable",
        help="Durable mode: fsync every file and directory entry the command writes before its "
        "commit is acknowledged, so a power loss cannot take it (local tables; a no-op on object "
        "stores).",
    ),
]
JsonOption = Annotated[
    bool,
    typer.Option("--json", help="Print JSON for scripts instead of tables.", rich_help_panel=GLOBAL_PANEL),
]
DebugOption = Annotated[
    bool,
    typer.Option("--debug", help="Print tracebacks of errors.", rich_help_panel=GLOBAL_PANEL),
]


@dataclass
class Settings:
    """The global options of one run (one call of :func:`eventlog.cli.main`)."""

    slots: str | None = None
    storage_options: dict[str, str] = field(default_factory=dict)
    log_level: LogLevel | None = None
    json: bool = False
    debug: bool = False
    parse_only: bool = False  # main(parse_only=True): stop once the arguments parsed

    def merge(
        self,
        *,
        slots: str | None,
        storage_option: list[str] | None,
        log_level: LogLevel | None,
        json_output: bool,
        debug: bool,
    ) -> None:
        if slots is not None:
            self.slots = slots
        for value in storage_option or []:
            key, item = parse_storage_option(value)
            self.storage_options[key] = item
        if log_level is not None:
            self.log_level = log_level
        self.json = self.json or json_output
        self.debug = self.debug or debug

    @contextmanager
    def log_to_stderr(self) -> Iterator[None]:
        """Send the ``eventlog`` and ``lockstore`` loggers to stderr at the chosen level while
        the command runs (restored afterwards: tests call ``main`` many times)."""
        level = getattr(logging, (self.log_level or LogLevel.warning).upper())
        handler = RichHandler(console=Console(stderr=True), show_path=False, level=level)
        loggers = [logging.getLogger(name) for name in LOGGERS]
        saved = [lg.level for lg in loggers]
        for lg in loggers:
            lg.setLevel(level)
            lg.addHandler(handler)
        try:
            yield
        finally:
            for lg, old in zip(loggers, saved, strict=True):
                lg.removeHandler(handler)
                lg.setLevel(old)

    # ------------------------------------------------------------------ tables

    def open(self, uri: str, *, durable: bool = False) -> Table:
        """The table at ``uri``, read to its latest version (TableNotFoundError if absent);
        ``durable``: opened in durable mode (the ``--durable`` of commands that commit)."""
        return Table.open(
            uri, slots=self.slots, storage_options=self.storage_options or None, durable=durable
        )

    def handle(self, uri: str, *, durable: bool = False) -> Table:
        """A handle that has read nothing (see :meth:`Table.handle`): the slots commands and
        ``verify`` must see the slots and the log before reading the log acts on them.
        TableNotFoundError when ``uri`` holds no ``_delta_log``."""
        table = Table.handle(uri, self.slots, storage_options=self.storage_options or None, durable=durable)
        if not table.log.list_log():
            table.close()
            raise TableNotFoundError(table.uri)
        return table


def settings_of(ctx: typer.Context) -> Settings:
    """The settings of the run in progress (the context's object, made by :func:`main`)."""
    return ctx.ensure_object(Settings)


def root_callback(
    ctx: typer.Context,
    slots: SlotsOption = None,
    storage_option: StorageOption = None,
    log_level: LogLevelOption = None,
    json_output: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Delta-Lake-compatible tables from the shell: history, reads, audits, maintenance."""
    settings_of(ctx).merge(
        slots=slots, storage_option=storage_option, log_level=log_level, json_output=json_output, debug=debug
    )


_GLOBALS = [
    inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
    for name, annotation, default in (
        ("slots", SlotsOption, None),
        ("storage_option", StorageOption, None),
        ("log_level", LogLevelOption, None),
        ("json_output", JsonOption, False),
        ("debug", DebugOption, False),
    )
]


def with_global_options(func: Callable[..., int | None]) -> Callable[..., int | None]:
    """A subcommand taking the global options too.

    ``func(settings, **arguments)`` gets the merged :class:`Settings` as its first
    argument; the wrapper's signature (what typer reads) is ``func``'s other parameters
    plus the global options.
    """
    signature = inspect.signature(func, eval_str=True)
    own = list(signature.parameters.values())[1:]
    names = {p.name for p in own}
    clash = names & {"ctx", *(p.name for p in _GLOBALS)}
    assert not clash, f"{func.__name__} redefines global options {clash}"

    @functools.wraps(func)
    def wrapper(ctx: typer.Context, **kwargs: Any) -> int | None:
        settings = settings_of(ctx)
        settings.merge(
            slots=kwargs.pop("slots"),
            storage_option=kwargs.pop("storage_option"),
            log_level=kwargs.pop("log_level"),
            json_output=kwargs.pop("json_output"),
            debug=kwargs.pop("debug"),
        )
        if settings.parse_only:
            return 0
        with settings.log_to_stderr():
            return func(settings, **kwargs)

    context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
    params = [context, *own, *_GLOBALS]
    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper
