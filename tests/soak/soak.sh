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
# Pass criteria (from the report; "live" is Redis' used_memory, the usable size of its
# blocks, or for MariaDB the MEMORY table's data, whose rows are malloc'ed; "over empty"
# is above the idle server's value at the start):
#   - no client error, no lost or wrong value (every value is checked);
#   - the server exits cleanly on SIGTERM (and under Keel printed its statistics);
#   - after each cycle deletes 90% of the keys and settles (4 s, > KEEL_PURGE_DELAY; up to
#     12 s while RSS is not yet near the live data, since a loaded machine delays the purger):
#       RSS over empty <= SOAK_RSS_FACTOR x the cycle's peak live data + SOAK_RSS_SLACK_MB
#     i.e. never above the high-water mark of the data: the 10% survivors are spread
#     over every slab, so neither Keel nor glibc can give most of that memory back
#     (measured, Redis: Keel 0.75-0.8 x peak live, glibc up to 1.25 x);
#   - after deleting everything: RSS over empty <= SOAK_END_FACTOR (0.6) x peak live + slack;
#   - no growth: the highest post-delete RSS of the second half of the cycles is at most
#     SOAK_GROWTH (1.15) x the highest of the first half + 16 MiB.
# Slack: Redis 32 MiB, MariaDB 96 MiB (its InnoDB buffer pool, 32 MiB, fills during the run).
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
  redis) factor=${SOAK_RSS_FACTOR:-1.0} slack=${SOAK_RSS_SLACK_MB:-32} ;;
  mariadb) factor=${SOAK_RSS_FACTOR:-1.0} slack=${SOAK_RSS_SLACK_MB:-96} ;;
esac
$py - "$out" "$factor" "$slack" "${SOAK_GROWTH:-1.15}" "$src" "$lrc" "$lib" "$stats" <<'PY'
import json, sys
out, factor, slack, growth, src, lrc, lib, stats = sys.argv[1:9]
factor, slack, growth, src, lrc, stats = float(factor), float(slack) * 1024, float(growth), int(src), int(lrc), int(stats)
end_factor = float(__import__("os").environ.get("SOAK_END_FACTOR", "0.6"))
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
peak_live = 0
for c in r["cycles"]:
    s = c["after_shrink"]
    grow_live = max(0, c["after_grow"]["live_bytes"] - b["live_bytes"]) / 1024
    peak_live = max(peak_live, grow_live)
    rss_over = s["rss_kib"] - b["rss_kib"]
    bound = factor * grow_live + slack
    checks.append({"cycle": c["cycle"], "rss_over_empty_kib": rss_over,
                   "live_after_delete_kib": int(max(0, s["live_bytes"] - b["live_bytes"]) / 1024),
                   "live_at_peak_kib": int(grow_live), "bound_kib": int(bound), "ok": rss_over <= bound})
    if c["verify_bad"] or c["churn_bad"]:
        fails.append("cycle %d: %d wrong values" % (c["cycle"], c["verify_bad"] + c["churn_bad"]))
    if rss_over > bound:
        fails.append("cycle %d: after deletes RSS is %d MiB over empty, above %.2f x the cycle's peak live data (%d MiB) + %d MiB"
                     % (c["cycle"], rss_over >> 10, factor, int(grow_live) >> 10, int(slack) >> 10))
end_over = (r["end"]["rss_kib"] or 0) - b["rss_kib"]
end_bound = end_factor * peak_live + slack
if end_over > end_bound:
    fails.append("after deleting everything RSS is %d MiB over empty, above %.2f x peak live (%d MiB) + %d MiB"
                 % (end_over >> 10, end_factor, int(peak_live) >> 10, int(slack) >> 10))
post = [c["after_shrink"]["rss_kib"] for c in r["cycles"]]
if len(post) >= 4:
    h = len(post) // 2
    lim = growth * max(post[:h]) + 16 * 1024
    if max(post[h:]) > lim:
        fails.append("RSS grows across cycles: post-delete RSS up to %d MiB in the second half > %.2f x %d MiB + 16 MiB"
                     % (max(post[h:]) >> 10, growth, max(post[:h]) >> 10))
r["judgement"] = {"rss_factor": factor, "end_factor": end_factor, "rss_slack_kib": int(slack),
                  "growth": growth, "cycles": checks, "end_over_empty_kib": end_over, "end_bound_kib": int(end_bound),
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
