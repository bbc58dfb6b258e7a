#!/usr/bin/env bash
# The Maven step shared by bootstrap_delta.sh and bootstrap_s3a.sh: resolve (and download into
# ~/.m2 on first use) a pom's runtime dependencies into CACHE/maven, then keep only the jars
# whose artifact pyspark does not ship (two versions of one class on the classpath: pyspark's
# is the one Spark is built and tested with). Writes CACHE/jars.txt (absolute paths, for
# spark.jars) and CACHE/excluded.txt (each left-out jar and why); fails when no jar whose
# name begins with REQUIRED was kept. The caller checks for mvn, and stamps CACHE/.resolved.
#
# usage: resolve_maven_jars.sh TAG PYTHON POM CACHE PYSPARK_JARS REQUIRED [ALSO_DROP NOTE]
#   TAG        prefix of the error message (the calling script's name)
#   PYTHON     an interpreter to split the jars with
#   POM        the pom whose runtime dependencies to resolve
#   CACHE      absolute output directory
#   PYSPARK_JARS  pyspark's jars directory
#   REQUIRED   how the name of a jar that must be kept begins (e.g. delta-spark_)
#   ALSO_DROP  leave out the artifacts starting with this too; NOTE says why in excluded.txt
set -euo pipefail

if [ $# -ne 6 ] && [ $# -ne 8 ]; then
  echo "usage: $0 TAG PYTHON POM CACHE PYSPARK_JARS REQUIRED [ALSO_DROP NOTE]" >&2
  exit 2
fi
tag=$1 python=$2 pom=$3 cache=$4 pyspark_jars=$5 required=$6 also_drop=${7:-} note=${8:-}

rm -rf "$cache/maven" "$cache/jars.txt" "$cache/excluded.txt" "$cache/.resolved"
mkdir -p "$cache/maven"
mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime \
  -DoutputDirectory="$cache/maven" >&2
"$python" - "$cache" "$pyspark_jars" "$tag" "$required" "$also_drop" "$note" <<'PY'
"""Split the resolved jars: those whose artifact pyspark ships are left out."""

import os
import re
import sys

cache, pyspark_jars, tag, required, also_drop, note = sys.argv[1:7]


def artifact(jar: str) -> str:
    match = re.match(r"^(.+?)-\d[^/]*\.jar$", jar)
    return match.group(1) if match else jar


shipped = {artifact(j): j for j in os.listdir(pyspark_jars) if j.endswith(".jar")}
keep, drop = [], []
for jar in sorted(os.listdir(os.path.join(cache, "maven"))):
    if not jar.endswith(".jar"):
        continue
    name = artifact(jar)
    if name in shipped or (also_drop and name.startswith(also_drop)):
        drop.append(f"{jar}\tpyspark ships {shipped.get(name, note)}")
    else:
        keep.append(os.path.join(cache, "maven", jar))
if not any(os.path.basename(j).startswith(required) for j in keep):
    sys.exit(f"{tag}: Maven resolved no {required.rstrip('_-')} jar")
with open(os.path.join(cache, "excluded.txt"), "w") as f:
    f.write("".join(line + "\n" for line in drop))
with open(os.path.join(cache, "jars.txt"), "w") as f:
    f.write("".join(path + "\n" for path in keep))
PY
