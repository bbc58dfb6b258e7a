"""The embedded slot store: a :class:`LocalFileSlotStore` inside one table's directory.

A table without a named slot store keeps its slots in ``<table>/_eventlog/slots``. That
store serves exactly one table, so it does not key the table by its location: every key
maps to the one slot directory under its root. A copy of the table (``cp -a``) or a
table moved to another path keeps its claims and their anchored digests, so ``verify``
still checks the copy against them (a store keyed by the path would find none there).

Layout: ``root/table/`` holds the slots (as :mod:`lockstore.localfs` lays them out).
Earlier releases keyed the embedded store by the table's path too
(``root/<sanitised path>-<sha1>/``); such a directory, when it is the only one, is used as
it is, so tables written before keep their history of claims (nothing is renamed: a
reader never writes).
"""

from __future__ import annotations

import os

from lockstore.localfs import LocalFileSlotStore

EMBEDDED_DIR = "table"  # never a name table_dir_name gives: those end in "-<sha1>"


class EmbeddedSlotStore(LocalFileSlotStore):
    """The slot store that lives inside one table (see the module docstring): any key
    names the same slots. Guarantees and non-guarantees are the local-file store's."""

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = False) -> None:
        super().__init__(root, fsync=fsync)
        self._table_dir: str | None = None

    def table_dir(self, table: str) -> str:
        directory = self._table_dir
        if directory is None:
            directory = self._table_dir = self._resolve()
        return directory

    def _resolve(self) -> str:
        own = os.path.join(self.root, EMBEDDED_DIR)
        if os.path.lexists(own):
            return own
        try:
            names = [
                name
                for name in os.listdir(self.root)
                if not name.startswith(("_", ".")) and os.path.isdir(os.path.join(self.root, name))
            ]
        except FileNotFoundError:
            return own
        return os.path.join(self.root, names[0]) if len(names) == 1 else own

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root!r})"


def is_embedded_root(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a table's embedded slot store (``<table>/_eventlog/slots``)."""
    parts = os.path.normpath(os.fspath(path)).split(os.sep)
    return parts[-2:] == ["_eventlog", "slots"]
