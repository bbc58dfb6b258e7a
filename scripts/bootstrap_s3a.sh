#!/usr/bin/env bash
# Idempotent set-up of S3A for native Spark scans of s3:// tables (spark_adapter/s3a.py):
# hadoop-aws and the AWS SDK v2 modules it needs, resolved by Maven from jvm/hadoopaws/pom.xml
# into .cache/hadoopaws-jars (outside git), less every jar whose artifact pyspark already
# ships (pyspark's wins: hadoop-client-*, netty, httpclient...). .cache/hadoopaws-jars/jars.txt
# lists the ones to put on spark.jars (spark_adapter.s3a_jars() reads it).
# Skipped when already done for this pom and this pyspark; Maven comes from Debian when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
POM=jvm/hadoopaws/pom.xml
CACHE=${EVENTLOG_S3A_JARS:-.cache/hadoopaws-jars}
case "$CACHE" in /*) ;; *) CACHE="$PWD/$CACHE" ;; esac # jars.txt lists absolute paths

log() { echo "bootstrap_s3a: $*" >&2; }

if ! pyspark_jars="$("$VENV/bin/python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))' 2>/dev/null)"; then
  log "no pyspark in $VENV (the 'spark' extra): nothing to do"
  exit 0
fi
jar_stamp="$CACHE/.resolved"
jar_want="$(sha256sum "$POM" | cut -d' ' -f1) $(ls "$pyspark_jars" | sha256sum | cut -d' ' -f1)"
if [ -f "$jar_stamp" ] && [ "$(cat "$jar_stamp")" = "$jar_want" ] && [ -f "$CACHE/jars.txt" ]; then
  exit 0
fi

# hadoop-aws must be the version of pyspark's Hadoop client (S3A calls into hadoop-common).
hadoop_api="$(ls "$pyspark_jars" | sed -n 's/^hadoop-client-api-\(.*\)\.jar$/\1/p')"
pom_hadoop="$(sed -n 's:.*<hadoop.version>\(.*\)</hadoop.version>.*:\1:p' "$POM")"
if [ "$hadoop_api" != "$pom_hadoop" ]; then
  log "pyspark ships hadoop-client-api $hadoop_api but $POM asks for hadoop-aws $pom_hadoop: update the pom"
  exit 1
fi

if ! command -v mvn >/dev/null; then
  if [ "${EVENTLOG_SKIP_APT:-0}" = 1 ] || ! command -v apt-get >/dev/null; then
    log "mvn not found: install Maven for hadoop-aws (native s3:// scans)"
    exit 1
  fi
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  log "installing Debian package maven"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -q maven >&2 || { $sudo apt-get update -q >&2 && $sudo apt-get install -y -q maven >&2; }
fi

log "resolving hadoop-aws $pom_hadoop and the AWS SDK modules with Maven ($POM) into $CACHE"
# pyspark ships hadoop-client-api/runtime, which hadoop-client-* would duplicate.
./scripts/resolve_maven_jars.sh bootstrap_s3a "$VENV/bin/python" "$POM" "$CACHE" "$pyspark_jars" hadoop-aws- \
  hadoop-client- hadoop-client-api/runtime
echo "$jar_want" > "$jar_stamp"
log "$(wc -l < "$CACHE/jars.txt") jars for spark.jars ($(tr '\n' '\0' < "$CACHE/jars.txt" | xargs -0 cat | wc -c) bytes), $(wc -l < "$CACHE/excluded.txt") left to pyspark"
