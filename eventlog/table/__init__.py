"""The table API (the facade): :class:`Table` handles and :func:`write_table`."""

from eventlog.table.handle import Table
from eventlog.table.write import write_table

__all__ = ["Table", "write_table"]
