"""Native scans of ``s3://`` tables: the table's fsspec ``storage_options`` as S3A settings.

Spark's Parquet source reads ``s3://`` tables through Hadoop's S3A connector (``hadoop-aws``
and the AWS SDK v2 modules it needs: :func:`s3a_jars`, put on ``spark.jars``). The table's
fsspec/s3fs options (endpoint, credentials, region...) are translated to S3A keys
(:func:`translate`) and given to that read only, as Spark file-source reader options: Spark
merges a relation's options into the Hadoop configuration its scan uses, on the driver and,
shipped with the scan, on every executor. The session's configuration is never changed.

**One scheme per option set.** Hadoop caches one ``FileSystem`` per (scheme, bucket) in each
JVM, built with the configuration of the first read that asked: a second read of the same
bucket with other options (another endpoint, other credentials) would silently get the
first one's connection, and a later read with no options would reuse a table's credentials.
So each set of translated options gets its own URI scheme, ``s3a-<digest>``, mapped to
``S3AFileSystem`` by ``fs.s3a-<digest>.impl`` in the same reader options: reads with equal
options share one cached file system per bucket, reads with different options never do.
The digest is an HMAC under a key drawn at import, so it tells nothing about the secrets.
Files then appear in plans and ``inputFiles()`` as ``s3a-<digest>://bucket/key``.

**Secrets** travel only as reader options: Spark redacts option values whose key matches
``spark.redaction.regex`` (``secret``, ``token``, ``access.key``...) wherever it prints
them, and the scan's description lists no options. Log lines and errors here name option
keys, never values.

Options the translation cannot express (:class:`Untranslatable`), a table with options on
another scheme, or a session without ``hadoop-aws`` make the read fall back to the
``eventlog`` Python data source (:mod:`spark_adapter.native` logs one INFO line).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pyspark.sql import SparkSession

from eventlog.log.location import TableLocation
from spark_adapter.session import is_connect

__all__ = [
    "IGNORED",
    "JARS_ENV",
    "S3A_FILESYSTEM",
    "HadoopTarget",
    "Untranslatable",
    "s3a_available",
    "s3a_jars",
    "s3a_target",
    "translate",
]

S3A_FILESYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"
JARS_ENV = "EVENTLOG_S3A_JARS"
"""Directory of the resolved jars (``jars.txt`` in it), default ``.cache/hadoopaws-jars`` in
the repository (``scripts/bootstrap_s3a.sh`` fills it)."""

_PROVIDER = "org.apache.hadoop.fs.s3a."
_SDK_CLASS = "software.amazon.awssdk.services.s3.S3Client"
_DEFAULT_REGION = "us-east-1"  # botocore's when an endpoint is given and no region is configured
_SALT = secrets.token_bytes(32)
_S3_SCHEMES = frozenset({"s3", "s3a"})

IGNORED = frozenset(
    {
        "skip_instance_cache",
        "use_listings_cache",
        "listings_expiry_time",
        "max_paths",
        "default_block_size",
        "default_fill_cache",
        "default_cache_type",
        "cache_regions",
        "fixed_upload_size",
    }
)
"""s3fs options about fsspec's own caches and uploads: no meaning for a read through S3A."""


class Untranslatable(ValueError):
    """A storage option with no S3A equivalent; ``key`` names it (dotted for nested
    ``client_kwargs``/``config_kwargs`` entries), never its value."""

    def __init__(self, key: str) -> None:
        super().__init__(f"storage option {key!r} has no S3A equivalent")
        self.key = key


@dataclass(frozen=True)
class HadoopTarget:
    """Where Spark's Parquet source reads a table: the Hadoop URI of its root, and the reader
    options (merged into that relation's Hadoop configuration) that reach it."""

    root: str
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def scheme(self) -> str:
        return self.root.split("://", 1)[0] if "://" in self.root else "file"

    def __repr__(self) -> str:  # option keys only: values may be secrets
        return f"HadoopTarget({self.root!r}, options={sorted(self.options)})"


# --------------------------------------------------------------------------- translation


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise Untranslatable(key)


def _text(key: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    raise Untranslatable(key)


def _millis(key: str, value: Any) -> str:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise Untranslatable(key) from None
    if isinstance(value, bool) or seconds < 0:
        raise Untranslatable(key)
    return f"{round(seconds * 1000)}ms"


def _count(key: str, value: Any, minus: int = 0) -> str:
    if isinstance(value, bool):
        raise Untranslatable(key)
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise Untranslatable(key) from None
    if number < minus:
        raise Untranslatable(key)
    return str(number - minus)


def _mapping(key: str, value: Any) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    raise Untranslatable(key)


def translate(storage_options: Mapping[str, Any]) -> dict[str, str]:
    """The S3A settings (``fs.s3a.*``) equivalent to fsspec/s3fs ``storage_options``.

    Raises :class:`Untranslatable` naming the first option it cannot express (the table
    is then read by the Python data source). The table is in the README ("Two read paths").
    """
    out: dict[str, str] = {}
    creds: dict[str, str] = {}
    endpoint: str | None = None
    region: str | None = None
    style: str | None = None
    anon = False

    def credential(key: str, name: str, value: Any) -> None:
        creds[name] = _text(key, value)

    for key, value in storage_options.items():
        if key in IGNORED:
            continue
        if key == "endpoint_url":
            endpoint = _text(key, value)
        elif key in ("key", "secret", "token"):
            credential(key, key, value)
        elif key == "anon":
            anon = _bool(key, value)
        elif key in ("region", "region_name"):
            region = _text(key, value)
        elif key == "use_ssl":
            out["fs.s3a.connection.ssl.enabled"] = str(_bool(key, value)).lower()
        elif key == "requester_pays":
            out["fs.s3a.requester.pays.enabled"] = str(_bool(key, value)).lower()
        elif key == "client_kwargs":
            for sub, v in _mapping(key, value).items():
                k = f"client_kwargs.{sub}"
                if sub == "endpoint_url":
                    endpoint = _text(k, v)
                elif sub == "region_name":
                    region = _text(k, v)
                elif sub == "use_ssl":
                    out["fs.s3a.connection.ssl.enabled"] = str(_bool(k, v)).lower()
                elif sub in ("aws_access_key_id", "aws_secret_access_key", "aws_session_token"):
                    name = {"aws_access_key_id": "key", "aws_secret_access_key": "secret"}.get(sub, "token")
                    credential(k, name, v)
                else:
                    raise Untranslatable(k)
        elif key == "config_kwargs":
            for sub, v in _mapping(key, value).items():
                k = f"config_kwargs.{sub}"
                if sub == "s3":
                    for name, setting in _mapping(k, v).items():
                        if name != "addressing_style" or setting not in ("path", "virtual", "auto"):
                            raise Untranslatable(f"{k}.{name}")
                        style = setting
                elif sub == "retries":
                    for name, setting in _mapping(k, v).items():
                        if name != "max_attempts":  # "mode" (standard, adaptive) has no S3A twin
                            raise Untranslatable(f"{k}.{name}")
                        # botocore counts the first attempt, S3A (the SDK's numRetries) does not.
                        out["fs.s3a.attempts.maximum"] = _count(f"{k}.{name}", setting, minus=1)
                elif sub == "region_name":
                    region = _text(k, v)
                elif sub == "connect_timeout":
                    out["fs.s3a.connection.establish.timeout"] = _millis(k, v)
                elif sub == "read_timeout":
                    out["fs.s3a.connection.timeout"] = _millis(k, v)
                elif sub == "max_pool_connections":
                    out["fs.s3a.connection.maximum"] = _count(k, v, minus=0)
                else:
                    raise Untranslatable(k)
        else:
            raise Untranslatable(key)

    if endpoint is not None:
        parsed = urlparse(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise Untranslatable("endpoint_url")
        out["fs.s3a.endpoint"] = endpoint
        out.setdefault("fs.s3a.connection.ssl.enabled", str(parsed.scheme == "https").lower())
        region = region or _DEFAULT_REGION
    if region is not None:
        out["fs.s3a.endpoint.region"] = region
    if style is not None and style != "auto":
        out["fs.s3a.path.style.access"] = str(style == "path").lower()
    elif endpoint is not None:
        # S3-compatible servers (and IP-address endpoints) need path-style requests.
        out["fs.s3a.path.style.access"] = "true"
    if anon:
        if creds:
            raise Untranslatable("anon")  # anonymous and credentials at once: s3fs takes anon
        out["fs.s3a.aws.credentials.provider"] = _PROVIDER + "AnonymousAWSCredentialsProvider"
    elif creds:
        if "key" not in creds or "secret" not in creds:
            raise Untranslatable("token" if "token" in creds else ("secret" if "secret" in creds else "key"))
        out["fs.s3a.access.key"] = creds["key"]
        out["fs.s3a.secret.key"] = creds["secret"]
        if "token" in creds:
            out["fs.s3a.session.token"] = creds["token"]
            out["fs.s3a.aws.credentials.provider"] = _PROVIDER + "TemporaryAWSCredentialsProvider"
        else:
            out["fs.s3a.aws.credentials.provider"] = _PROVIDER + "SimpleAWSCredentialsProvider"
    return out


def read_scheme(settings: Mapping[str, str]) -> str:
    """The URI scheme of reads with ``settings``: ``s3a-`` and an HMAC of them (see the
    module docstring), equal for equal settings within this process."""
    text = "\n".join(f"{k}={v}" for k, v in sorted(settings.items()))
    return "s3a-" + hmac.new(_SALT, text.encode(), hashlib.sha256).hexdigest()[:20]


# --------------------------------------------------------------------------- the session


_lock = threading.Lock()
_available: dict[str, bool] = {}  # Spark application id -> S3A and the SDK load


def s3a_available(spark: SparkSession) -> bool:
    """Can the driver JVM load S3A (``hadoop-aws``) and the AWS SDK's S3 client? Checked
    once per Spark application. False on Spark Connect, whose client cannot ask the JVM
    (native reads are off there, see :func:`spark_adapter.native.native_target`)."""
    if is_connect(spark):
        return False
    app = str(spark.sparkContext.applicationId)
    with _lock:
        if app not in _available:
            _available[app] = _load(spark)
        return _available[app]


def _load(spark: SparkSession) -> bool:
    jvm: Any = spark.sparkContext._jvm
    try:
        conf = spark.sparkContext._jsc.hadoopConfiguration()
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass("s3a", conf)
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        loader.loadClass(_SDK_CLASS)
    except Exception:  # py4j wraps UnsupportedFileSystemException / ClassNotFoundException
        return False
    return True


def s3a_target(spark: SparkSession, location: TableLocation) -> HadoopTarget | str:
    """Where Spark reads ``location`` (an ``s3://``/``s3a://`` table with storage options)
    natively, or why it cannot (for the fallback's log line: keys, never values)."""
    scheme = urlparse(location.uri).scheme
    if scheme not in _S3_SCHEMES:
        return "it has storage options, which Spark's Hadoop layer cannot take for its scheme"
    if not s3a_available(spark):
        return "hadoop-aws (S3A) is not on Spark's classpath"
    try:
        settings = translate(location.storage_options)
    except Untranslatable as exc:
        return str(exc)
    read = read_scheme(settings)
    options = {f"fs.{read}.impl": S3A_FILESYSTEM, **settings}
    return HadoopTarget(f"{read}://{location.uri.split('://', 1)[1]}", options)


def s3a_jars() -> list[str]:
    """Paths of the jars S3A needs beside pyspark's (``hadoop-aws`` and the AWS SDK modules),
    as ``scripts/bootstrap_s3a.sh`` resolved them: put them on ``spark.jars`` before the
    session starts. FileNotFoundError, saying what to run, when they are not there."""
    default = Path(__file__).resolve().parents[1] / ".cache" / "hadoopaws-jars"
    directory = Path(os.environ.get(JARS_ENV) or default)
    listing = directory / "jars.txt"
    if not listing.is_file():
        raise FileNotFoundError(f"{listing} not found: run scripts/bootstrap_s3a.sh (Maven) first")
    jars = [line.strip() for line in listing.read_text().splitlines() if line.strip()]
    missing = [j for j in jars if not Path(j).is_file()]
    if missing or not jars:
        raise FileNotFoundError(f"{listing} lists missing jars {missing[:3]}: run scripts/bootstrap_s3a.sh")
    return jars
