"""The write path: a transaction's recorded reads and staged writes
(:mod:`~eventlog.txn.transaction`), the commit loops (plain and group commit), the conflict
checker with row-level resolution, and the retry policy.
"""
