# redis_server.sh -- start and stop Debian's redis-server under LD_PRELOAD=<libkeel.so>,
# for the shell tests that drive one (tests/override/redis.sh,
# tests/jemalloc/redis_jemalloc.sh). Source it after tests/override/common.sh: it uses
# that file's ov_* helpers, and the server is stopped by PID whatever happens.
#
#   REDIS_SERVER               the server program (default /usr/bin/redis-server)
#   redis_start [options...]   after ov_init: starts the server on 127.0.0.1 (a free
#                              port) with its directory in $OV_TMP/data, no persistence,
#                              DEBUG allowed from local clients, KEEL_STATS=1, and the
#                              given redis-server options; waits until it answers PING
#                              (30 s) and checks that /proc/<pid>/maps shows the library.
#                              Sets port, rpid, out_log, err_log.
#   cli [arguments...]         redis-cli against that server (60 s timeout)
#   redis_python [arguments...]  Debian's python3 with this folder on its module path:
#                              `from redis_resp import resp` encodes commands for
#                              `cli --pipe` (tests/harness/redis_resp.py)
#   redis_stop                 the server must still run; stops it with SIGTERM (a clean
#                              exit is required), then checks its log's goodbye line and
#                              Keel's exit statistics in its stderr.

REDIS_SERVER=${REDIS_SERVER:-/usr/bin/redis-server}
REDIS_HARNESS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

cli() { timeout 60 redis-cli -h 127.0.0.1 -p "$port" "$@"; }
redis_ping_ok() { [[ "$(cli PING 2>/dev/null)" == PONG ]]; }
redis_python() {
  PYTHONPATH=$REDIS_HARNESS${PYTHONPATH:+:$PYTHONPATH} PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 "$@"
}

redis_start() {
  port=$(ov_free_port)
  local data=$OV_TMP/data
  mkdir -p "$data"
  out_log=$OV_TMP/redis.out
  err_log=$OV_TMP/redis.err
  ov_log "starting redis-server on 127.0.0.1:$port"
  env LD_PRELOAD="$OV_LIB" KEEL_STATS=1 "$REDIS_SERVER" \
    --bind 127.0.0.1 --port "$port" --protected-mode yes \
    --save '' --appendonly no --dir "$data" --daemonize no --supervised no \
    --logfile '' --loglevel notice --enable-debug-command local "$@" \
    >"$out_log" 2>"$err_log" </dev/null &
  rpid=$!
  ov_register "$rpid" redis-server "$out_log" "$err_log"
  ov_wait_for 30 "$rpid" redis-server redis_ping_ok
  ov_log "redis-server (pid $rpid) answers PING"
  # (a) the library is mapped in the server.
  ov_check_maps "$rpid" redis-server
}

redis_stop() {
  ov_running "$rpid" || ov_fail "redis-server is gone"
  ov_stop_checked "$rpid"
  grep -q 'ready to exit, bye bye' "$out_log" "$err_log" ||
    ov_fail "redis-server log has no 'ready to exit, bye bye'"
  # (b) Keel's exit statistics, from the server process itself.
  ov_check_stats "$err_log" redis-server "$rpid"
}
