"""Native reads: a snapshot's live files through Spark's built-in Parquet source.

``read_table(spark, uri)`` resolves the snapshot on the driver and hands its file list to
Spark's vectorized Parquet reader, so no row passes through Python:

- the schema is the table's, given explicitly (columns missing from older files read as
  null, as in the engine);
- partition columns are typed from the table schema and filled from each file's
  ``partitionValues`` (never parsed from directory names: paths need not follow Hive
  layout), one scan per partition, unioned; past :data:`MAX_PARTITION_SCANS` partitions,
  one scan joined to a broadcast table of (file path, partition values);
- ``where=`` prunes files on the driver (partition values, then min/max statistics)
  before Spark sees the list, and is applied to the rows too; Spark itself still prunes
  columns and pushes filters into Parquet row groups;
- files with a deletion vector lose their deleted rows inside Spark (:func:`_dv_filter`):
  the driver decodes the DVs into one bit array per scan, and a filter tests
  ``_metadata.row_index`` against it. Files without a DV are read by another scan that
  pays nothing for it.

``s3://`` tables are scanned through S3A when ``hadoop-aws`` is on Spark's classpath: the
table's fsspec ``storage_options`` become S3A settings given to that read only
(:mod:`spark_adapter.s3a`). Where Spark's Hadoop layer has no filesystem for the table's
scheme (``memory://``, or ``s3://`` without ``hadoop-aws``), where a table on another scheme
comes with ``storage_options``, or where an option has no S3A equivalent, ``read_table``,
``EventlogTable.toDF`` and DML reads fall back to the ``eventlog`` Python data source (Python
tasks read the files with fsspec, the options passed as its ``storageOptions``), with one
INFO log line naming the reason (option keys, never values).

On a Spark Connect session every read takes that fallback (:func:`native_target`): the
native scan's planning needs the JVM, which a Connect client has no access to.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from functools import reduce
from typing import Any
from urllib.parse import unquote, urlparse

import orjson
import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from eventlog import expr as ex
from eventlog.errors import DataFileNotFoundError
from eventlog.files import column_mapping as cm
from eventlog.files.partition_values import decode_partition_value
from eventlog.files.pruning import prune_files
from eventlog.files.schema import from_spark_schema_json, to_spark_schema_json
from eventlog.log.actions import AddFile
from eventlog.log.filetable import add_files
from eventlog.log.location import TableLocation
from eventlog.snapshot import Snapshot
from eventlog.table import Table
from spark_adapter import jvm_reader, s3a
from spark_adapter.native_dv import distinct_sizes, dv_filter, dv_scans, size_lookup
from spark_adapter.s3a import HadoopTarget
from spark_adapter.session import is_connect
from spark_adapter.types import activate_session, nullable_schema, storage_spark_options

__all__ = [
    "MAX_PARTITION_SCANS",
    "NATIVE_CONF",
    "NativeScan",
    "Tags",
    "native_enabled",
    "tagged_rows",
    "hadoop_uri",
    "native_target",
    "read_table",
    "snapshot_dataframe",
]

log = logging.getLogger("spark_adapter.native")

MAX_PARTITION_SCANS = 64
"""Up to this many distinct partitions, each is its own scan with its values as literals;
beyond it, one scan and a broadcast join on the file path (planning many scans is slower
than the join)."""

_SCHEMES = {"file": "file", "local": "file", "s3": "s3a", "s3a": "s3a", "gs": "gs", "gcs": "gs"}
_PATH_COL = "__eventlog_native_path"
_ROW_INDEX = "_metadata.row_index"
NATIVE_CONF = "spark.eventlog.native.enabled"
"""Session conf: ``false`` makes ``read_table``/``toDF`` and DML read through the Python
data source instead (a switch for comparison and for filesystems Spark misreads)."""


def read_table(
    spark: SparkSession,
    uri: str,
    version: int | None = None,
    timestamp: dt.datetime | str | int | None = None,
    storage_options: dict[str, Any] | None = None,
    where: str | None = None,
    *,
    slots: Any = None,
) -> DataFrame:
    """The table at ``version``/``timestamp`` (latest when both are None) as a DataFrame read
    by Spark's own Parquet reader; ``where`` (SQL) prunes files on the driver and filters rows.

    ``storage_options`` (fsspec options: endpoint, credentials...) open the table; with
    them, or on a scheme Spark's Hadoop layer cannot open (``s3://`` without ``hadoop-aws``,
    ``memory://``), the rows are read by the ``eventlog`` Python data source instead, its
    tasks given the same options (see the module docstring).
    """
    location = TableLocation.of(uri, storage_options)
    with Table.open(location.uri, slots=slots, storage_options=location.storage_options) as table:
        snap = table.snapshot(version, timestamp=timestamp)
        canonical = TableLocation.of(table.uri, location.storage_options)
    return snapshot_dataframe(spark, canonical, snap, where, slots=slots)


def snapshot_dataframe(
    spark: SparkSession,
    location: str | TableLocation,
    snapshot: Snapshot,
    where: str | None = None,
    *,
    slots: Any = None,
) -> DataFrame:
    """The live rows of ``snapshot`` (of the table at ``location``): natively when Spark can
    open the files, else through the Python data source (one INFO log line says so)."""
    location = TableLocation.of(location)
    scan = NativeScan(spark, location, snapshot, where)
    target = native_target(spark, location)
    if isinstance(target, str) or not native_enabled(spark):
        why = f"{NATIVE_CONF} is false" if isinstance(target, HadoopTarget) else target
        log.info(
            "native read of %s off (%s): reading version %d through the eventlog Python data source",
            location.uri,
            why,
            snapshot.version,
        )
        return scan.python_source(slots)
    return scan.dataframe(target)


def native_target(spark: SparkSession, location: TableLocation) -> HadoopTarget | str:
    """Where Spark's Parquet reader scans ``location`` (its Hadoop root URI and the reader
    options that reach it), or why it cannot: no Hadoop FileSystem for the scheme, or fsspec
    storage options with no Hadoop equivalent (those only the Python data source's tasks can
    use). ``s3://`` options are translated by :func:`spark_adapter.s3a.s3a_target`.

    On Spark Connect there is never a native target: planning the scan needs the JVM (the
    Hadoop FileSystem lookup, Hadoop's path qualification, the deletion-vector reader), which
    a Connect client cannot reach, so ``read_table``, ``toDF`` and DML reads go through the
    ``eventlog`` Python data source or the adapter's Python read tasks there."""
    if is_connect(spark):
        return "Spark Connect session (no JVM access from the client)"
    if location.options:
        return s3a.s3a_target(spark, location)
    scheme = urlparse(location.uri).scheme
    if scheme in ("s3", "s3a") and not s3a.s3a_available(spark):
        return "hadoop-aws (S3A) is not on Spark's classpath"
    root = hadoop_uri(spark, location.uri)
    return "Spark's Hadoop layer cannot open its scheme" if root is None else HadoopTarget(root)


def hadoop_uri(spark: SparkSession, uri: str) -> str | None:
    """The Hadoop form of a table or file URI (``file:/...``, ``s3a://...``), or None when the
    JVM has no Hadoop FileSystem for its scheme."""
    parsed = urlparse(uri)
    scheme = parsed.scheme if len(parsed.scheme) > 1 else "file"  # "C:" is a drive
    hadoop_scheme = _SCHEMES.get(scheme, scheme)
    jvm: Any = spark.sparkContext._jvm
    try:
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(
            hadoop_scheme, spark.sparkContext._jsc.hadoopConfiguration()
        )
    except Exception:  # py4j wraps UnsupportedFileSystemException / ClassNotFoundException
        return None
    if hadoop_scheme == "file":
        return "file:" + (parsed.path if parsed.scheme else uri)
    return f"{hadoop_scheme}://{uri.split('://', 1)[1]}"


class NativeScan:
    """One snapshot, planned for Spark's Parquet source."""

    def __init__(
        self,
        spark: SparkSession,
        location: str | TableLocation,
        snapshot: Snapshot,
        where: str | None = None,
        *,
        files: Sequence[AddFile] | None = None,
        schema_string: str | None = None,
    ) -> None:
        """Plan ``snapshot``'s live files (or ``files``), pruned by ``where``; rows get the
        columns of ``schema_string`` (default: the snapshot's schema)."""
        self.spark = spark
        self.location = TableLocation.of(location)
        self.uri = self.location.uri
        self.snapshot = snapshot
        self.where = where
        self.fs, self.root = self.location.files()
        text = schema_string if schema_string is not None else snapshot.metadata.schema_string
        self.schema = T.StructType.fromJson(orjson.loads(text))
        self.arrow_schema = from_spark_schema_json(text)
        self.partition_columns = tuple(snapshot.partition_columns)
        parts = set(self.partition_columns)
        self.data_schema = T.StructType([f for f in self.schema.fields if f.name not in parts])
        # Column mapping: Spark reads the files' physical names (nested ones too), which the
        # scan casts (positionally) and renames to the logical ones; partition values are
        # keyed by physical names.
        self.file_schema = self.data_schema
        self.partition_keys = tuple(cm.partition_keys(self.arrow_schema, self.partition_columns))
        if cm.is_mapped(self.arrow_schema):
            physical = cm.physical_schema(pa.schema([f for f in self.arrow_schema if f.name not in parts]))
            self.file_schema = T.StructType.fromJson(orjson.loads(to_spark_schema_json(physical)))
        predicate = None if where is None else ex.parse_predicate(where, snapshot.schema, context="where")
        if files is None:  # the snapshot's files: pruned on columns, values only for those kept
            self.total_files = snapshot.num_files
            _, selected = snapshot.select_files(predicate)
            planned = sorted(add_files(selected), key=lambda a: a.path)
        else:
            planned = list(files)
            self.total_files = len(planned)
            if predicate is not None:
                _, planned = prune_files(planned, predicate, snapshot.schema, self.partition_columns)
        self.files = planned

    # ------------------------------------------------------------------ fallback

    def python_source(self, slots: Any) -> DataFrame:
        activate_session(self.spark)
        reader = self.spark.read.format("eventlog").option("versionAsOf", self.snapshot.version)
        reader = reader.options(**storage_spark_options(self.location))
        if isinstance(slots, str):
            reader = reader.option("slots", slots)
        return self._filtered(reader.load(self.uri))

    # ------------------------------------------------------------------ native

    def dataframe(self, target: HadoopTarget, tags: Tags | None = None) -> DataFrame:
        """The live rows of the planned files, in table column order; with ``tags``, also
        each row's file id and physical row position (DML's read, :func:`tagged_rows`)."""
        log.info(
            "native scan of %s at version %d: %d of %d files after pruning (%s)",
            self.uri,
            self.snapshot.version,
            len(self.files),
            self.total_files,
            self.where or "no filter",
        )
        # Every column nullable, as in all Spark file sources: the union with an empty
        # relation sets that (a partition value is a non-null literal otherwise). limit(0)
        # lets the optimizer see that it is empty and drop it (a bare createDataFrame([])
        # is an RDD it cannot look into: the union then costs a stage and its tasks).
        out = nullable_schema(self.schema)
        if tags is not None:
            out = T.StructType([*out.fields, *tags.fields])
        empty = self.spark.createDataFrame([], out).limit(0)
        if not self.files:
            return empty
        groups: dict[tuple[str | None, ...], list[AddFile]] = {}
        for f in self.files:
            key = tuple(f.partition_values.get(c) for c in self.partition_keys)
            groups.setdefault(key, []).append(f)
        if not self.partition_columns or len(groups) <= MAX_PARTITION_SCANS:
            frames = [
                self._with_literals(self._live_rows(target, files, tags), key, tags)
                for key, files in groups.items()
            ]
        else:
            frames = [self._with_joined_values(target, tags)]
        return self._filtered(reduce(DataFrame.union, frames, empty))

    def _filtered(self, df: DataFrame) -> DataFrame:
        return df if self.where is None else df.where(F.expr(self.where))

    def _read(self, target: HadoopTarget, files: Sequence[AddFile]) -> DataFrame:
        paths = [file_uri(target.root, f.path) for f in files]
        # __globPaths__: a file name is a name, not a pattern ("[", "*", "?" are legal).
        reader = self.spark.read.schema(self.file_schema).option("__globPaths__", "false")
        try:
            return reader.options(**target.options).parquet(*paths)
        except AnalysisException as exc:
            if "PATH_NOT_FOUND" not in str(exc):
                raise
            missing = str(exc).split("Path does not exist:", 1)[-1].strip().split(" ", 1)[0].rstrip(".")
            raise DataFileNotFoundError(self.uri, missing, self.snapshot.version) from exc

    def _live_rows(self, target: HadoopTarget, files: Sequence[AddFile], tags: Tags | None) -> DataFrame:
        """Data columns (and ``tags``) of the live rows of ``files`` (deletion vectors applied)."""
        plain = [f for f in files if f.deletion_vector is None]
        # Tags tell files apart by size: each scan's files must differ in it.
        chunks = (distinct_sizes(plain) if tags is not None else [plain]) if plain else []
        frames = [(chunk, self._read(target, chunk)) for chunk in chunks]
        with_dv = [f for f in files if f.deletion_vector is not None]
        jvm = self._jvm_dv_read(target, with_dv) if with_dv and tags is None else None
        if jvm is not None:
            frames.append((with_dv, jvm))
        else:
            for chunk in dv_scans(self.fs, self.root, files):
                frames.append((chunk, self._read(target, chunk).where(dv_filter(self.fs, self.root, chunk))))
        names = [_col(n) for n in self.data_schema.fieldNames()]
        if self.file_schema is not self.data_schema:  # column mapping: physical -> logical
            names = [
                _col(p.name).cast(f.dataType).alias(f.name)
                for p, f in zip(self.file_schema.fields, self.data_schema.fields, strict=True)
            ]
        return reduce(
            DataFrame.union,
            [df.select(*names, *(tags.columns(chunk) if tags is not None else [])) for chunk, df in frames],
        )

    def _jvm_dv_read(self, target: HadoopTarget, files: Sequence[AddFile]) -> DataFrame | None:
        """``files`` (all with a DV) through :mod:`spark_adapter.jvm_reader`, or None where it
        cannot serve: no JDK, columns it cannot compact, or file names that collide."""
        if not jvm_reader.supports(self.file_schema) or not jvm_reader.usable(self.spark):
            return None
        options = jvm_reader.dv_options(self.fs, self.root, files)
        if options is None:
            return None
        paths = [file_uri(target.root, f.path) for f in files]
        try:
            return jvm_reader.read(self.spark, self.file_schema, paths, {**target.options, **options})
        except AnalysisException as exc:
            if "PATH_NOT_FOUND" not in str(exc):
                raise
            return None  # _read names the missing file

    def _with_literals(self, df: DataFrame, key: tuple[str | None, ...], tags: Tags | None) -> DataFrame:
        values = dict(zip(self.partition_columns, key, strict=True))
        arrow = self.arrow_schema

        def column(f: T.StructField) -> Column:
            if f.name not in values:
                return _col(f.name)
            return partition_literal(values[f.name], f.dataType, arrow.field(f.name).type).alias(f.name)

        return df.select(*[column(f) for f in self.schema.fields], *_tag_names(tags))

    def _with_joined_values(self, target: HadoopTarget, tags: Tags | None) -> DataFrame:
        """All files in one scan; partition values joined on ``_metadata.file_path``."""
        rows = self._live_rows(target, self.files, tags).withColumn(_PATH_COL, F.col("_metadata.file_path"))
        paths = [file_uri(target.root, f.path) for f in self.files]
        qualified = _qualified_paths(self.spark, paths, target.options)
        fields = [self.schema[c] for c in self.partition_columns]
        keyed = list(zip(fields, self.partition_keys, strict=True))  # column mapping: physical keys
        table = self.arrow_schema
        carriers = [
            (path, *[_carrier(f.partition_values.get(k), table.field(c.name).type) for c, k in keyed])
            for path, f in zip(qualified, self.files, strict=True)
        ]
        carrier_schema = T.StructType(
            [
                T.StructField(_PATH_COL, T.StringType()),
                *[T.StructField(c.name, _carrier_type(c.dataType)) for c in fields],
            ]
        )
        values = self.spark.createDataFrame(carriers, carrier_schema).select(
            _col(_PATH_COL), *[_from_carrier(_col(c.name), c.dataType).alias(c.name) for c in fields]
        )
        joined = rows.join(F.broadcast(values), _PATH_COL, "inner")
        return joined.select(*[_col(f.name) for f in self.schema.fields], *_tag_names(tags))


class Tags:
    """Columns DML reads with each row: its file's id and its physical position in the file
    (what a deletion vector addresses)."""

    def __init__(self, ids: Mapping[str, int], file_column: str, position_column: str) -> None:
        self.ids = ids  # add.path -> file id
        self.file_column = file_column
        self.position_column = position_column
        self.fields = [
            T.StructField(file_column, T.IntegerType(), nullable=True),
            T.StructField(position_column, T.LongType(), nullable=True),
        ]

    def columns(self, files: Sequence[AddFile]) -> list[Column]:
        """The tag columns of a scan of ``files`` (which differ in size)."""
        by_size = {f.size: self.ids[f.path] for f in files}
        file_id = F.expr(f"cast({size_lookup(sorted(by_size.items()), 'a file of this scan')} as int)")
        return [file_id.alias(self.file_column), F.col(_ROW_INDEX).alias(self.position_column)]


def _tag_names(tags: Tags | None) -> list[Column]:
    return [] if tags is None else [_col(tags.file_column), _col(tags.position_column)]


def tagged_rows(
    spark: SparkSession,
    location: TableLocation,
    snapshot: Snapshot | None,
    schema_string: str,
    files: Sequence[tuple[int, AddFile]],
    file_column: str,
    position_column: str,
) -> DataFrame | None:
    """Live rows of ``files`` (id, file) with their file id and physical position, read
    natively; None when the session disables native reads or Spark cannot open the files
    (see :func:`native_target`)."""
    target = native_target(spark, location)
    if isinstance(target, str) or snapshot is None or not native_enabled(spark):
        return None
    scan = NativeScan(spark, location, snapshot, files=[f for _, f in files], schema_string=schema_string)
    tags = Tags({f.path: fid for fid, f in files}, file_column, position_column)
    return scan.dataframe(target, tags)


def native_enabled(spark: SparkSession) -> bool:
    """The session conf :data:`NATIVE_CONF` (default true)."""
    return str(spark.conf.get(NATIVE_CONF, "true")).strip().lower() != "false"


# --------------------------------------------------------------------------- paths and values


def file_uri(root: str, path: str) -> str:
    """Hadoop URI of a data file named by ``add.path`` (percent-encoded, relative or absolute).

    Hadoop's ``Path`` takes unescaped text and escapes it itself, so the decoded path is
    passed (a literal ``%3A`` in a partition directory name stays one).
    """
    parsed = urlparse(path)
    if parsed.scheme:
        scheme = _SCHEMES.get(parsed.scheme, parsed.scheme)
        read_scheme = root.split("://", 1)[0]
        if scheme == "s3a" and read_scheme.startswith("s3a-"):  # this read's S3A options
            scheme = read_scheme
        rest = unquote(path.split(":", 1)[1])
        return f"{scheme}:{rest}"
    return f"{root.rstrip('/')}/{unquote(path)}"


_PLAIN_NAME = re.compile(r"[A-Za-z0-9._-]+")  # a file name no URI encoding can change


def _qualified_paths(spark: SparkSession, paths: Sequence[str], options: Mapping[str, str] = {}) -> list[str]:
    """``_metadata.file_path`` as Spark will report it for each Hadoop path (read with the
    reader ``options``, which reach the file system as they do in Spark's scan).

    The JVM qualifies each distinct directory once (a call per partition, not per file);
    a file name of plain characters is then appended as it is, and any other file name is
    qualified whole by the JVM, so the result is always Hadoop's own spelling.
    """
    jvm: Any = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    if options:  # a copy: the session's configuration stays as it is
        conf = jvm.org.apache.hadoop.conf.Configuration(conf)
        for key, value in options.items():
            conf.set(key, value)

    def qualify(path: str) -> str:
        hp = jvm.org.apache.hadoop.fs.Path(path)
        return str(hp.getFileSystem(conf).makeQualified(hp).toUri().toString())

    directories: dict[str, str] = {}
    out = []
    for p in paths:
        head, _, name = p.rpartition("/")
        if head and _PLAIN_NAME.fullmatch(name):
            if head not in directories:
                directories[head] = qualify(head).rstrip("/")
            out.append(f"{directories[head]}/{name}")
        else:
            out.append(qualify(p))
    return out


def _col(name: str) -> Column:
    return F.col("`" + name.replace("`", "``") + "`")


def partition_literal(value: str | None, spark_type: T.DataType, arrow_type: pa.DataType) -> Column:
    """The typed value of a partition column from its ``partitionValues`` string."""
    return _from_carrier(F.lit(_carrier(value, arrow_type)), spark_type)


def _carrier_type(t: T.DataType) -> T.DataType:
    """The simple Spark type a partition value travels as before :func:`_from_carrier`."""
    if isinstance(t, T.TimestampType):
        return T.LongType()  # microseconds since the epoch: exact in any session time zone
    if isinstance(t, (T.TimestampNTZType, T.DateType, T.DecimalType)):
        return T.StringType()
    return t


def _carrier(value: str | None, arrow_type: pa.DataType) -> Any:
    decoded = decode_partition_value(value, arrow_type)
    if decoded is None:
        return None
    if isinstance(decoded, dt.datetime):
        if decoded.tzinfo is not None:
            delta = decoded - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
            return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        return decoded.isoformat(sep=" ")
    if isinstance(decoded, (dt.date, Decimal)):
        return str(decoded)
    if isinstance(decoded, bytes):
        return bytearray(decoded)
    return decoded


def _from_carrier(column: Column, t: T.DataType) -> Column:
    if isinstance(t, T.TimestampType):
        return F.timestamp_micros(column)
    return column.cast(t)
