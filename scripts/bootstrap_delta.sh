#!/usr/bin/env bash
# Idempotent set-up of the Delta Spark peer of the test suite (tests/deltaspark):
#   * .venv-delta: this project (editable, as scripts/bootstrap.sh installs it) on pyspark 4.2.0,
#     the Spark line Delta Spark 4.4 is built for (jvm/deltaspark/constraints.txt);
#   * Delta Spark's jars, resolved by Maven from jvm/deltaspark/pom.xml into .cache/deltaspark-jars
#     (outside git), less every jar whose artifact pyspark already ships (pyspark's wins);
#     .cache/deltaspark-jars/jars.txt lists the ones to put on spark.jars.
# Each step is skipped when already done. Maven comes from Debian when `mvn` is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${DELTA_VENV:-.venv-delta}
EXTRAS=test,dv,spark
EDITABLE_MODE=compat # why: see scripts/bootstrap.sh
PEER=jvm/deltaspark
CACHE=.cache/deltaspark-jars

log() { echo "bootstrap_delta: $*" >&2; }

apt_install() {
  if [ "${EVENTLOG_SKIP_APT:-0}" = 1 ]; then
    log "EVENTLOG_SKIP_APT=1: not installing $1"
    return 1
  fi
  local sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  if ! command -v apt-get >/dev/null; then
    log "apt-get not found: install $1 yourself"
    return 1
  fi
  log "installing Debian package $1"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -q "$1" >&2 || { $sudo apt-get update -q >&2 && $sudo apt-get install -y -q "$1" >&2; }
}

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi

stamp="$VENV/.eventlog-installed"
want="$(cat pyproject.toml "$PEER/constraints.txt" | sha256sum | cut -d' ' -f1) $EXTRAS editable_mode=$EDITABLE_MODE"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  log "installing eventlog-tables[$EXTRAS] (editable) and delta-spark into $VENV, pinned by $PEER/constraints.txt"
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  "$VENV/bin/python" -m pip install -q -c "$PEER/constraints.txt" -e ".[$EXTRAS]" delta-spark \
    --config-settings editable_mode="$EDITABLE_MODE" >&2
  echo "$want" > "$stamp"
fi

if ! command -v mvn >/dev/null; then
  apt_install maven || exit 1
fi

# Resolve (and download into ~/.m2 on first use) delta-spark and its runtime dependencies,
# then keep only the jars pyspark lacks (scripts/resolve_maven_jars.sh). Redone when the pom
# or the pyspark install changes.
pyspark_jars="$("$VENV/bin/python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')"
jar_stamp="$CACHE/.resolved"
jar_want="$(sha256sum "$PEER/pom.xml" | cut -d' ' -f1) $(ls "$pyspark_jars" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$jar_stamp" ] || [ "$(cat "$jar_stamp")" != "$jar_want" ] || [ ! -f "$CACHE/jars.txt" ]; then
  log "resolving Delta Spark's jars with Maven ($PEER/pom.xml) into $CACHE"
  ./scripts/resolve_maven_jars.sh bootstrap_delta "$VENV/bin/python" "$PEER/pom.xml" "$PWD/$CACHE" \
    "$pyspark_jars" delta-spark_
  echo "$jar_want" > "$jar_stamp"
  log "$(wc -l < "$CACHE/jars.txt") jars for spark.jars, $(wc -l < "$CACHE/excluded.txt") left to pyspark"
fi
