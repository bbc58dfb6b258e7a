#!/usr/bin/env bash
# Idempotent set-up of a fresh machine: a virtual environment with the project and its
# test tools, plus the Debian packages the test suite needs (ZooKeeper; Java is assumed).
# Safe to run repeatedly: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-test,zookeeper,dv,spark,connect,metrics,s3,docs}

log() { echo "bootstrap: $*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi

# Editable install in setuptools' "compat" mode: a .pth file puts the repository root on
# sys.path. The default mode installs an import hook instead, which pkgutil.iter_modules does
# not see, and PySpark finds Python data sources by listing top-level `pyspark_*` modules
# that way: Spark's Python workers would find `pyspark_eventlog` only when started from the
# repository directory (DATA_SOURCE_NOT_FOUND everywhere else). The "strict" mode would also
# work, but it misses files added or renamed after the install. setuptools calls "compat"
# transitional but has set no date for its removal.
EDITABLE_MODE=compat

# Reinstall only when pyproject.toml, the extras or the editable mode changed since the last
# successful install.
stamp="$VENV/.eventlog-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $EXTRAS editable_mode=$EDITABLE_MODE"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  log "installing eventlog-tables[$EXTRAS] (editable, $EDITABLE_MODE mode) into $VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  "$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]" --config-settings editable_mode="$EDITABLE_MODE" >&2
  echo "$want" > "$stamp"
fi

# A JDK's javac: spark_adapter.jvm_reader compiles the deletion-vector Parquet reader on
# first use (Java itself is assumed; without javac reads fall back to a slower SQL filter and
# the tests that check the JVM reader fail).
if ! command -v javac >/dev/null && [ "${EVENTLOG_SKIP_APT:-0}" != 1 ]; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  if command -v apt-get >/dev/null; then
    log "installing Debian package openjdk-17-jdk-headless (javac)"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get install -y -q openjdk-17-jdk-headless >&2 || { $SUDO apt-get update -q >&2 && $SUDO apt-get install -y -q openjdk-17-jdk-headless >&2; }
  else
    log "apt-get not found: install a JDK (javac) yourself for the JVM deletion-vector reader"
  fi
fi

# The Debian ZooKeeper package (for the ZooKeeper-backed slot store tests). No service
# is started here; the test suite starts its own server on a free loopback port.
if [ ! -f /usr/share/java/zookeeper.jar ] && [ "${EVENTLOG_SKIP_APT:-0}" != 1 ]; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  if command -v apt-get >/dev/null; then
    log "installing Debian package zookeeper"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get install -y -q zookeeper >&2 || { $SUDO apt-get update -q >&2 && $SUDO apt-get install -y -q zookeeper >&2; }
  else
    log "apt-get not found: install ZooKeeper yourself for the ZooKeeper tests"
  fi
fi

# The fault tests' tools (tests/faults): fuse3 (fusermount3 and libfuse 3, for the power-loss
# and slow-disk FUSE file system), faketime (libfaketime, a writer's clock hours off), iproute2
# (`ip netns`, veth pairs and bridges for network partitions).
need=()
command -v fusermount3 >/dev/null || need+=(fuse3)
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || [ -n "$(find /usr/lib -name libfaketime.so.1 2>/dev/null | head -1)" ] || need+=(faketime)
command -v ip >/dev/null || need+=(iproute2)
if [ "${#need[@]}" -gt 0 ] && [ "${EVENTLOG_SKIP_APT:-0}" != 1 ]; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  if command -v apt-get >/dev/null; then
    log "installing Debian packages ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get install -y -q "${need[@]}" >&2 || { $SUDO apt-get update -q >&2 && $SUDO apt-get install -y -q "${need[@]}" >&2; }
  else
    log "apt-get not found: install ${need[*]} yourself for the fault tests"
  fi
fi

# hadoop-aws and the AWS SDK modules S3A needs, from Maven into .cache/hadoopaws-jars, for
# native Spark scans of s3:// tables (the suite's SparkSession puts them on spark.jars).
# Skipped when already resolved for this pom and this pyspark.
VENV="$VENV" ./scripts/bootstrap_s3a.sh
