"""Operations planned inside a transaction (append, overwrite, DELETE, UPDATE, MERGE, OPTIMIZE,
REORG PURGE, RESTORE, property and column changes, VACUUM), and the
:class:`~eventlog.ops.transaction.Transaction` users hold, which runs them.
"""
