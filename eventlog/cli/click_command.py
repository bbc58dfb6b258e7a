"""The ``eventlog`` program as one click command, for tools that document click programs: the
site's CLI reference (``docs/reference/cli.md``) renders it with mkdocs-click.

``command`` is what :func:`eventlog.cli.main.main` runs: the typer app's click group, with
every subcommand, its arguments, options and help.
"""

from __future__ import annotations

import typer

from eventlog.cli.main import app

command = typer.main.get_command(app)

__all__ = ["command"]
