"""The Spark executors of eventlog's operations, one module per operation as in
:mod:`eventlog.ops`: DELETE (:mod:`.delete`), UPDATE (:mod:`.update`), MERGE (:mod:`.merge`)
and OPTIMIZE (:mod:`.optimize`), over the shared job machinery (:mod:`.jobs`) and the
row rewrite DELETE and UPDATE share (:mod:`.rows`). Each plans with the engine's own
planning code and runs the data work as Spark jobs."""
