"""The event store: Delta actions and their codec, ``_delta_log`` storage, the commit log
(reading, staging and publishing versions under slot claims), and checkpoints.

The lowest layer of the engine: it knows nothing of Parquet data, SQL or transactions.
"""
