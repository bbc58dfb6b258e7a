"""The ``eventlog`` command line."""

from eventlog.cli.main import main

__all__ = ["main"]
