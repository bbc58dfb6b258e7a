"""Deletion vectors applied inside Spark's vectorized Parquet reader (a small JVM class).

``jvm/eventlogdv/DvParquetFormat.java`` subclasses Spark's ``ParquetFileFormat``: its reader
asks Spark for each row's physical index, tests every batch against the file's deletion
bits, and compacts the batch's column vectors in place, so the plan carries no per-row
filter. Measured at 0.93x of a plain Parquet scan with 10% of the rows deleted, against
~0.6x for the SQL filter of :mod:`spark_adapter.native_dv` (``bench/RESULTS-spark.md``).

The source ships with the package. On first use in a session it is compiled with the JDK's
``javac`` against the running pyspark's jars, cached under ``~/.cache/eventlog-tables``
(one jar per source and Spark version), and added with ``ADD JAR``, which also sends it to
executors. Without a JDK, or when anything fails, :func:`usable` says no and reads use the
SQL filter instead (one WARNING). The session conf :data:`DV_READER_CONF` (``jvm`` or
``sql``, default ``jvm``) chooses.

The reader compacts only flat columns of the types in :data:`SUPPORTED`; tables with other
columns (decimals, nested types) use the SQL filter.

Native scans only, ``s3://`` tables through S3A included (the driver reads the deletion
vectors through fsspec; the reader's options ride along with the read's S3A options). Reads
that fall back to the Python data source (:func:`spark_adapter.native.native_target`) apply
deletion vectors in its tasks.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote

import fsspec
import pyspark
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from eventlog.log.actions import AddFile
from spark_adapter.native_dv import dv_words
from spark_adapter.session import is_connect

__all__ = ["DV_READER_CONF", "FORMAT", "SUPPORTED", "dv_options", "read", "supports", "usable"]

log = logging.getLogger("spark_adapter.jvm_reader")

FORMAT = "eventlogdv.DvParquetFormat"
DV_READER_CONF = "spark.eventlog.native.dvReader"
SUPPORTED = (
    T.LongType,
    T.IntegerType,
    T.ShortType,
    T.ByteType,
    T.DoubleType,
    T.FloatType,
    T.BooleanType,
    T.StringType,
    T.BinaryType,
    T.DateType,
    T.TimestampType,
    T.TimestampNTZType,
)
_SOURCES = Path(__file__).parent / "jvm" / "eventlogdv"
_COMPILE_SECONDS = 180
_lock = threading.Lock()
_loaded: dict[str, bool] = {}  # Spark application id -> the jar is added (or failed)


def supports(schema: T.StructType) -> bool:
    """Can the reader compact every column of ``schema`` (data columns of the scan)?"""
    return all(isinstance(f.dataType, SUPPORTED) for f in schema.fields)


def usable(spark: SparkSession) -> bool:
    """Is the reader's class available in ``spark``'s application (compiled and added once)?
    Never on Spark Connect: the jar is built on this machine for the driver's JVM, which a
    Connect client does not share (native reads are off there anyway, see
    :func:`spark_adapter.native.native_target`)."""
    if is_connect(spark):
        return False
    if str(spark.conf.get(DV_READER_CONF, "jvm")).strip().lower() != "jvm":
        return False
    app = str(spark.sparkContext.applicationId)
    with _lock:
        if app not in _loaded:
            _loaded[app] = _add_jar(spark)
        return _loaded[app]


def dv_options(fs: fsspec.AbstractFileSystem, root: str, files: Sequence[AddFile]) -> dict[str, str] | None:
    """Reader options carrying each file's deletion bits, keyed by file name (case-blind, as
    Spark lowercases option keys); None when two files' names collide that way."""
    options: dict[str, str] = {}
    for f in files:
        name = unquote(f.path).rsplit("/", 1)[-1].lower()
        if "eventlog.dv." + name in options:
            return None
        words, _ = dv_words(fs, root, [f])
        options["eventlog.dv." + name] = base64.b64encode(words.astype("<i8").tobytes()).decode()
    return options


def read(
    spark: SparkSession, schema: T.StructType, paths: Sequence[str], options: dict[str, str]
) -> DataFrame:
    """The live rows of ``paths`` (files with deletion vectors) through the reader."""
    reader = spark.read.format(FORMAT).schema(schema).option("__globPaths__", "false").options(**options)
    return reader.load(list(paths))


def _add_jar(spark: SparkSession) -> bool:
    try:
        jar = _jar()
        spark.sql(f"ADD JAR '{jar}'")
        return True
    except Exception as exc:  # no JDK, a compile error against this Spark, a JVM error
        log.warning("deletion vectors: the JVM reader is unavailable (%s); using the SQL filter", exc)
        return False


def _jar() -> Path:
    """The compiled reader for these sources and this pyspark (built once, then cached)."""
    sources = sorted(_SOURCES.glob("*.java"))
    digest = hashlib.sha256(pyspark.__version__.encode())
    for src in sources:
        digest.update(src.read_bytes())
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "eventlog-tables"
    jar = cache / f"dvparquet-{digest.hexdigest()[:16]}.jar"
    if jar.exists():
        return jar
    javac, jar_tool = _jdk_tool("javac"), _jdk_tool("jar")
    jars = Path(pyspark.__file__).parent / "jars"
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as work:
        classes = Path(work) / "classes"
        compile_cmd = [javac, "--release", "17", "-nowarn", "-cp", f"{jars}/*", "-d", str(classes)]
        subprocess.run(
            [*compile_cmd, *map(str, sources)], check=True, capture_output=True, timeout=_COMPILE_SECONDS
        )
        built = Path(work) / "reader.jar"
        subprocess.run([jar_tool, "cf", str(built), "-C", str(classes), "."], check=True, capture_output=True)
        os.replace(built, jar)  # atomic: concurrent builders agree on the result
    return jar


def _jdk_tool(name: str) -> str:
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home) / "bin" / name if home else None
    found = str(candidate) if candidate is not None and candidate.exists() else shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found (a JDK is needed to build the reader)")
    return found
