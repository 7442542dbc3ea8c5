#!/usr/bin/env bash
# Soak: a real server under a given malloc with continuous mixed load for a while,
# sampling its RSS every second (tests/soak/soak_load.py does the load and the checks of
# every value; this script starts and stops the server and judges the report).
#
# Usage: bash tests/soak/soak.sh <redis|mariadb> <libkeel.so|glibc> <seconds> <report.json>
#
# The server runs on 127.0.0.1 (free port) / a socket in a throw-away directory and is
# stopped by its PID whatever happens (trap). Under Keel: KEEL_STATS=1, and the server's
# /proc/PID/maps must show the library.
#
# Pass criteria (from the report):
#   - no client error, no lost or wrong value (every value is checked);
#   - the server exits cleanly on SIGTERM;
#   - RSS follows the live data: after each cycle's deletes and a settle time,
#       RSS - RSS_empty <= SOAK_RSS_FACTOR x (live - live_empty) + SOAK_RSS_SLACK_MB
#     where live is Redis' used_memory (usable bytes of its blocks) or, for MariaDB, the
#     MEMORY table's data (its rows are malloc'ed; InnoDB's buffer pool is a fixed cost
#     that RSS_empty does not include, so MariaDB's slack is larger);
#   - no growth across cycles: the last cycle's post-delete RSS is at most
#     SOAK_GROWTH x the lowest post-delete RSS of the earlier cycles + 16 MiB.
# Defaults (measured on Debian 12, 2 cores, see tests/soak/README.md): Redis factor 1.5,
# slack 32 MiB; MariaDB factor 1.5, slack 160 MiB; growth 1.15.
set -uo pipefail
server=${1:?redis|mariadb} lib=${2:?libkeel.so|glibc} secs=${3:?seconds} out=${4:?report.json}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
py=/usr/bin/python3
log() { printf '[soak %s %s] %s\n' "$server" "$(date +%T)" "$*"; }

case $server in
  redis) bin=${REDIS_SERVER:-/usr/bin/redis-server}; $py -c 'import redis' 2>/dev/null || { log "SKIP: python3-redis missing"; exit 77; } ;;
  mariadb) bin=${MARIADBD:-/usr/sbin/mariadbd}; $py -c 'import pymysql' 2>/dev/null || { log "SKIP: python3-pymysql missing"; exit 77; } ;;
  *) exit 2 ;;
esac
[[ -x $bin ]] || { log "SKIP: $bin not installed"; exit 77; }

work=$(mktemp -d "${TMPDIR:-/tmp}/keel-soak-$server.XXXXXX")
chmod 755 "$work"
spid=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n $spid ]] && kill -0 "$spid" 2>/dev/null; then
    log "cleanup: stopping $server (pid $spid)"
    kill -TERM "$spid" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$spid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
  fi
  [[ ${KEEL_SOAK_KEEP:-0} != 0 ]] && log "kept $work" || rm -rf "$work"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

envp=(env)
if [[ $lib != glibc ]]; then
  lib=$(readlink -f "$lib")
  envp+=(LD_PRELOAD="$lib" KEEL_STATS=1)
fi
port=$($py -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
err=$work/server.err

if [[ $server == redis ]]; then
  "${envp[@]}" "$bin" --bind 127.0.0.1 --port "$port" --protected-mode yes --save '' \
    --appendonly no --dir "$work" --daemonize no --logfile '' --maxmemory 0 \
    --lazyfree-lazy-user-del yes >"$work/server.out" 2>"$err" </dev/null &
  spid=$!
  ready() { [[ "$(redis-cli -h 127.0.0.1 -p "$port" PING 2>/dev/null)" == PONG ]]; }
  load=(--server redis --port "$port" --keys "${SOAK_KEYS:-20000}")
else
  user=()
  [[ $(id -u) -eq 0 ]] && user=(--user=root)
  "${envp[@]:0:1}" mariadb-install-db --no-defaults "${user[@]}" --datadir="$work/data" \
    --auth-root-authentication-method=normal --skip-test-db >"$work/install.log" 2>&1 ||
    { tail -20 "$work/install.log"; log "FAIL: mariadb-install-db"; exit 1; }
  "${envp[@]}" "$bin" --no-defaults "${user[@]}" --datadir="$work/data" --tmpdir="$work" \
    --socket="$work/sock" --port="$port" --bind-address=127.0.0.1 --pid-file="$work/pid" \
    --skip-name-resolve --innodb-buffer-pool-size=32M --innodb-log-file-size=32M \
    --innodb-flush-log-at-trx-commit=0 --skip-log-bin --performance-schema=OFF \
    --max-heap-table-size=512M --max-allowed-packet=64M >"$work/server.out" 2>"$err" </dev/null &
  spid=$!
  ready() { mariadb --no-defaults -S "$work/sock" -u root -N -e 'SELECT 1' >/dev/null 2>&1; }
  load=(--server mariadb --socket "$work/sock" --keys "${SOAK_KEYS:-6000}")
fi
for _ in $(seq 1 240); do
  ready && break
  kill -0 "$spid" 2>/dev/null || { tail -20 "$err"; log "FAIL: $server died at start-up"; exit 1; }
  sleep 0.25
done
ready || { log "FAIL: $server not ready"; exit 1; }
if [[ $lib != glibc ]]; then
  grep -qF "$lib" "/proc/$spid/maps" || { log "FAIL: $lib not mapped in $server"; exit 1; }
  log "$server (pid $spid) maps $lib"
fi

log "load for $secs s (report: $out)"
$py "$here/soak_load.py" "${load[@]}" --pid "$spid" --duration "$secs" --out "$out" \
  --settle "${SOAK_SETTLE:-4}"
lrc=$?

log "stopping $server (pid $spid)"
kill -TERM "$spid"
src=0
for _ in $(seq 1 150); do kill -0 "$spid" 2>/dev/null || break; sleep 0.2; done
if kill -0 "$spid" 2>/dev/null; then kill -KILL "$spid"; src=255; fi
wait "$spid" 2>/dev/null || src=$?
spid=""
stats=0
[[ $lib != glibc ]] && stats=$(grep -c '^keel: statistics' "$err")

case $server in
  redis) factor=${SOAK_RSS_FACTOR:-1.5} slack=${SOAK_RSS_SLACK_MB:-32} ;;
  mariadb) factor=${SOAK_RSS_FACTOR:-1.5} slack=${SOAK_RSS_SLACK_MB:-160} ;;
esac
$py - "$out" "$factor" "$slack" "${SOAK_GROWTH:-1.15}" "$src" "$lrc" "$lib" "$stats" <<'PY'
import json, sys
out, factor, slack, growth, src, lrc, lib, stats = sys.argv[1:9]
factor, slack, growth, src, lrc, stats = float(factor), float(slack) * 1024, float(growth), int(src), int(lrc), int(stats)
r = json.load(open(out))
fails = []
if r["errors"]:
    fails.append("client errors / bad values: %s" % r["errors"][:5])
if lrc != 0:
    fails.append("load generator exit status %d" % lrc)
if src != 0:
    fails.append("server exit status %d after SIGTERM" % src)
if lib != "glibc" and stats == 0:
    fails.append("no 'keel: statistics' block in the server's stderr (KEEL_STATS=1)")
b = r["baseline"]
checks = []
for c in r["cycles"]:
    s = c["after_shrink"]
    rss_over = s["rss_kib"] - b["rss_kib"]
    live_over = max(0, s["live_bytes"] - b["live_bytes"]) / 1024
    bound = factor * live_over + slack
    checks.append({"cycle": c["cycle"], "rss_over_empty_kib": rss_over, "live_over_empty_kib": int(live_over),
                   "bound_kib": int(bound), "ok": rss_over <= bound})
    if c["verify_bad"] or c["churn_bad"]:
        fails.append("cycle %d: %d wrong values" % (c["cycle"], c["verify_bad"] + c["churn_bad"]))
    if rss_over > bound:
        fails.append("cycle %d: RSS %d MiB over empty, live data %d MiB over empty: above %.2f x live + %d MiB"
                     % (c["cycle"], rss_over >> 10, int(live_over) >> 10, factor, int(slack) >> 10))
post = [c["after_shrink"]["rss_kib"] for c in r["cycles"]]
if len(post) >= 3:
    lim = growth * min(post[:-1]) + 16 * 1024
    if post[-1] > lim:
        fails.append("RSS grows across cycles: last post-delete RSS %d MiB > %.2f x %d MiB + 16 MiB"
                     % (post[-1] >> 10, growth, min(post[:-1]) >> 10))
r["judgement"] = {"rss_factor": factor, "rss_slack_kib": int(slack), "growth": growth, "cycles": checks,
                  "post_delete_rss_kib": post, "server_exit": src, "keel_stats_blocks": stats,
                  "failures": fails, "pass": not fails}
json.dump(r, open(out, "w"), indent=1)
mib = lambda k: (k or 0) >> 10
print("soak %s under %s: %d s, %d cycles, ops %s; RSS start %d MiB, peak %d MiB, end %d MiB; post-delete RSS by cycle %s MiB; %s"
      % (r["server"], "glibc" if lib == "glibc" else "keel", r["duration_s"], len(r["cycles"]), r["ops"],
         mib(r["rss_start_kib"]), mib(r["rss_peak_kib"]), mib(r["rss_end_kib"]), [p >> 10 for p in post],
         "PASS" if not fails else "FAIL: " + "; ".join(fails)))
sys.exit(0 if not fails else 1)
PY
