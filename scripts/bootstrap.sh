#!/usr/bin/env bash
# Idempotent set-up of a fresh machine: a virtual environment with the project and its
# test tools, plus the Debian packages the test suite needs (ZooKeeper; Java is assumed).
# Safe to run repeatedly: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-test,zookeeper,dv,spark}

log() { echo "bootstrap: $*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi

# Reinstall only when pyproject.toml changed since the last successful install.
stamp="$VENV/.eventlog-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $EXTRAS"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  log "installing eventlog-tables[$EXTRAS] (editable) into $VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  "$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]" >&2
  echo "$want" > "$stamp"
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
