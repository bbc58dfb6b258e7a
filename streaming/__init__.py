"""Engine-neutral incremental reads and idempotent writes over :mod:`eventlog` tables.

Not implemented yet (the Structured Streaming issue). The package exists so the
dependency contracts (``streaming`` imports ``eventlog`` only) are enforced from day one.
"""
