#!/usr/bin/env bash
# start_zk.sh - run a throwaway standalone ZooKeeper 3.8 on loopback, for development and tests.
#
#   scripts/start_zk.sh start PORT DATADIR   start one server on 127.0.0.1:PORT keeping everything
#                                            in DATADIR; waits until it answers, then prints its PID
#   scripts/start_zk.sh stop DATADIR         stop the server started with DATADIR
#   scripts/start_zk.sh status PORT          print the server's 'srvr' report; exit 1 if none answers
#
# DATADIR holds zoo.cfg, log4j.properties, zookeeper.log, zookeeper.pid and ZooKeeper's data
# (data/version-2). Delete it after 'stop' to start from an empty tree next time.
#
# Environment (all optional):
#   ZK_TICK=2000           tickTime in ms; sessions may last 2..20 ticks (use 500 for expiry tests)
#   ZK_FORCE_SYNC=yes      'no' skips fdatasync of the transaction log: faster, not crash-safe
#   ZK_HEAP=256m           JVM maximum heap
#   ZK_START_TIMEOUT=60    seconds to wait for the server to answer
#   ZK_STOP_TIMEOUT=10     seconds between SIGTERM and SIGKILL on 'stop'
#   ZK_NO_INSTALL=1        never run apt-get; fail when ZooKeeper is missing
#
# Only the Debian package 'zookeeper' (jars, no service) is installed, and only when we are root.
# No system service is ever started: the server is a plain child process in its own session.
set -euo pipefail

JARS=/usr/share/java
ZK_JAR=$JARS/zookeeper.jar
HOST=127.0.0.1
MAIN=org.apache.zookeeper.server.quorum.QuorumPeerMain

say() { echo "start_zk: $*" >&2; }
die() { local rc=$1; shift; say "$*"; exit "$rc"; } # die EXIT_CODE MESSAGE...
usage() { sed -n '4,6p' "$0" >&2; exit 64; }

# Four-letter word over bash's /dev/tcp: prints the reply, fails if nothing listens.
ask() { # ask PORT WORD
  (
    exec 2>/dev/null
    exec 3<>"/dev/tcp/$HOST/$1" || exit 1
    printf '%s' "$2" >&3
    timeout 3 cat <&3 || true
  )
}

install_if_missing() {
  [ -f "$ZK_JAR" ] && return 0
  [ "${ZK_NO_INSTALL:-0}" = 1 ] && die 2 "$ZK_JAR is missing and ZK_NO_INSTALL=1"
  [ "$(id -u)" = 0 ] || die 2 "$ZK_JAR is missing; run 'sudo apt-get install -y zookeeper' (or ./scripts/bootstrap.sh as root)"
  command -v apt-get >/dev/null || die 2 "$ZK_JAR is missing and apt-get is not available"
  say "installing the Debian package 'zookeeper' (jars only, no service)"
  export DEBIAN_FRONTEND=noninteractive
  # A fresh machine may have empty package lists: update only when the first attempt fails.
  apt-get install -y -q zookeeper >&2 || { apt-get update -q >&2 && apt-get install -y -q zookeeper >&2; }
  [ -f "$ZK_JAR" ] || die 2 "apt-get finished but $ZK_JAR is still missing"
}

# The PID in DATADIR/zookeeper.pid, if that process is our ZooKeeper for this DATADIR.
our_pid() { # our_pid DATADIR
  local pidfile=$1/zookeeper.pid pid
  [ -f "$pidfile" ] || return 1
  pid=$(cat "$pidfile")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  # Guard against a recycled PID: the command line must name this DATADIR's zoo.cfg.
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$MAIN $1/zoo.cfg" || return 1
  echo "$pid"
}

start() { # start PORT DATADIR
  local port=$1 dir=$2 pid
  [[ $port =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] || die 64 "bad port: $port"
  install_if_missing
  command -v java >/dev/null || die 2 "java is not on PATH (apt-get install -y default-jre-headless)"
  mkdir -p "$dir/data"
  dir=$(cd "$dir" && pwd)
  if pid=$(our_pid "$dir"); then die 1 "a ZooKeeper (PID $pid) already runs with $dir"; fi
  if [ -n "$(ask "$port" srvr)" ]; then die 1 "something already answers on $HOST:$port"; fi

  cat >"$dir/zoo.cfg" <<EOF
tickTime=${ZK_TICK:-2000}
initLimit=10
syncLimit=5
dataDir=$dir/data
clientPort=$port
clientPortAddress=$HOST
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr,conf,cons,isro
forceSync=${ZK_FORCE_SYNC:-yes}
autopurge.snapRetainCount=3
autopurge.purgeInterval=1
EOF
  cat >"$dir/log4j.properties" <<'EOF'
log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
EOF

  local began; began=$(date +%s%N)
  # setsid: own session and process group, so 'stop' can signal the whole group and a Ctrl-C in
  # this terminal does not reach the server. zookeeper.jar's manifest lists its dependencies but
  # no slf4j binding; slf4j-log4j12 + log4j 1.2 supply one, otherwise the server logs nothing.
  setsid java -Xmx"${ZK_HEAP:-256m}" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData \
    -Djava.awt.headless=true -Dlog4j.configuration="file:$dir/log4j.properties" \
    -cp "$ZK_JAR:$JARS/slf4j-log4j12.jar:$JARS/log4j-1.2.jar" \
    "$MAIN" "$dir/zoo.cfg" >>"$dir/zookeeper.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$dir/zookeeper.pid"

  local limit=$((SECONDS + ${ZK_START_TIMEOUT:-60}))
  until [ "$(ask "$port" ruok)" = imok ] && ask "$port" srvr | grep -q '^Mode:'; do
    if ! kill -0 "$pid" 2>/dev/null; then
      say "ZooKeeper exited during start-up; last lines of $dir/zookeeper.log:"
      tail -n 25 "$dir/zookeeper.log" >&2
      rm -f "$dir/zookeeper.pid"
      exit 1
    fi
    if [ "$SECONDS" -ge "$limit" ]; then
      say "no answer on $HOST:$port after ${ZK_START_TIMEOUT:-60} s; killing PID $pid; last log lines:"
      tail -n 25 "$dir/zookeeper.log" >&2
      kill -KILL -- "-$pid" 2>/dev/null || true
      rm -f "$dir/zookeeper.pid"
      exit 1
    fi
    sleep 0.05
  done
  say "serving on $HOST:$port after $((($(date +%s%N) - began) / 1000000)) ms (PID $pid);" \
    "stop with: $0 stop $dir"
  echo "$pid"
}

stop() { # stop DATADIR
  local dir=$1 pid
  [ -d "$dir" ] || die 1 "no such directory: $dir"
  dir=$(cd "$dir" && pwd)
  if ! pid=$(our_pid "$dir"); then
    rm -f "$dir/zookeeper.pid"
    die 1 "no ZooKeeper of ours runs with $dir"
  fi
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
  local limit=$((SECONDS + ${ZK_STOP_TIMEOUT:-10}))
  while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$limit" ]; do sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    say "PID $pid still running ${ZK_STOP_TIMEOUT:-10} s after SIGTERM; sending SIGKILL"
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/zookeeper.pid"
  say "stopped PID $pid"
}

status() { # status PORT
  local out
  out=$(ask "$1" srvr) || exit 1
  [ -n "$out" ] || exit 1
  printf '%s\n' "$out"
}

case "${1:-}" in
  start) [ $# -eq 3 ] || usage; start "$2" "$3" ;;
  stop) [ $# -eq 2 ] || usage; stop "$2" ;;
  status) [ $# -eq 2 ] || usage; status "$2" ;;
  -h | --help) sed -n '2,21p' "$0" >&2 ;;
  *) usage ;;
esac
