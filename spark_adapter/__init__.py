"""PySpark glue for :mod:`eventlog` tables (the Spark issue).

Not implemented yet. The package exists so the dependency contracts (never imports
``kazoo``) are enforced from day one.
"""
