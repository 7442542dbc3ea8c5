#!/usr/bin/env bash
# Override test: Debian's redis-server under LD_PRELOAD=<libkeel.so>.
#   - redis-benchmark load (set/get/lpush/lpop/... with random keys, 100-byte values);
#   - a known data set (strings from 1 byte to 1 MiB, hashes, lists) written with
#     redis-cli --pipe and read back value by value;
#   - DEBUG RELOAD (save, free the whole data set, load it again) and a second read-back;
#   - FLUSHALL ASYNC (the data set is freed by Redis' lazy-free thread);
#   - INFO memory answers; SIGTERM gives a clean exit.
# Plus the proofs that Keel was the allocator: /proc/<pid>/maps and KEEL_STATS=1 output.
#
# Note: Debian's redis-server links libjemalloc.so.2 itself and, besides malloc, free,
# realloc, calloc and malloc_usable_size, calls jemalloc's mallctl, nallocx and
# malloc_stats_print (INFO's allocator_* fields, MEMORY PURGE, MEMORY MALLOC-STATS).
# Under the preload each of these that libkeel.so exports resolves to Keel (its jemalloc
# compatibility layer), anything else to the real jemalloc.
#
# Usage: bash tests/override/redis.sh /path/to/libkeel.so
OV_NAME=redis
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"
source "$here/../harness/redis_server.sh"

ov_need_server "$REDIS_SERVER"
ov_need_tool redis-cli redis-benchmark /usr/bin/python3
ov_init "$@"

# Starts the server, waits for PING and checks (a): the library is mapped in it.
redis_start --lazyfree-lazy-user-flush yes --lazyfree-lazy-user-del yes

# --- 1. benchmark load ---------------------------------------------------------------
tests=set,get,incr,lpush,rpush,lpop,rpop,sadd,hset,spop,zadd,lrange_100
ov_log "redis-benchmark -t $tests -n 100000 -r 100000 -d 100 -c 20 -P 16"
bench=$OV_TMP/bench.txt
OV_LOGS+=("$bench")
ov_run -o "$bench" timeout 120 redis-benchmark -h 127.0.0.1 -p "$port" -t "$tests" \
  -n 100000 -r 100000 -d 100 -c 20 -P 16 -q || ov_fail "redis-benchmark failed (status $?)"
# Progress lines end in \r; keep the final result lines only.
results=$(tr '\r' '\n' <"$bench" | grep 'requests per second' || true)
sed 's/^/    /' <<<"$results"
for t in SET GET INCR LPUSH RPUSH LPOP RPOP SADD HSET SPOP ZADD LRANGE_100; do
  grep -q "^$t.*: .*requests per second" <<<"$results" ||
    ov_fail "redis-benchmark printed no result for $t"
done
grep -qi 'error' "$bench" && ov_fail "redis-benchmark reported errors"
ov_running "$rpid" || ov_fail "redis-server died during the benchmark"
ov_log "ok: benchmark done, dbsize $(cli DBSIZE)"

# --- 2. a known data set ---------------------------------------------------------------
# gen.py writes load.resp (SET/HSET/RPUSH in the Redis protocol), get.txt (one read
# command per line) and expected.txt (the reply to each, one per line).
redis_python - "$OV_TMP" <<'PY'
import random, sys
from redis_resp import resp
d = sys.argv[1]
rng = random.Random(20240601)
alnum = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

def value(i, size):
    base = (b"%d:" % i) + bytes(alnum[(i * 7 + j) % len(alnum)] for j in range(64))
    return (base * (size // len(base) + 1))[:size]

with open(f"{d}/load.resp", "wb") as load, open(f"{d}/get.txt", "wb") as get, \
     open(f"{d}/expected.txt", "wb") as exp:
    for i in range(20000):
        r = rng.random()
        size = (rng.randrange(1, 64) if r < 0.5 else rng.randrange(64, 4096) if r < 0.97
                else rng.randrange(4096, 70000) if r < 0.998 else rng.randrange(500000, 1 << 20))
        key = b"ov:str:%d" % i
        v = value(i, size)
        load.write(resp(b"SET", key, v))
        get.write(b"GET " + key + b"\n")
        exp.write(v + b"\n")
    for h in range(300):
        key = b"ov:hash:%d" % h
        fields = []
        for f in range(1 + h % 97):
            fields += [b"f%d" % f, value(h * 1000 + f, 1 + (h * f) % 300)]
        load.write(resp(b"HSET", key, *fields))
        get.write(b"HLEN " + key + b"\n")
        exp.write(b"%d\n" % (1 + h % 97))
        f = (h * 13) % (1 + h % 97)
        get.write(b"HGET " + key + b" f%d\n" % f)
        exp.write(value(h * 1000 + f, 1 + (h * f) % 300) + b"\n")
    for l in range(200):
        key = b"ov:list:%d" % l
        items = [value(l * 7919 + k, 1 + (l + k) % 500) for k in range(1 + l % 150)]
        load.write(resp(b"RPUSH", key, *items))
        get.write(b"LLEN " + key + b"\n")
        exp.write(b"%d\n" % len(items))
        get.write(b"LINDEX " + key + b" -1\n")
        exp.write(items[-1] + b"\n")
PY
nexp=$(wc -l <"$OV_TMP/expected.txt")
ov_log "loading the known data set with redis-cli --pipe"
pipe_out=$OV_TMP/pipe.txt
OV_LOGS+=("$pipe_out")
cli --pipe <"$OV_TMP/load.resp" >"$pipe_out" 2>&1 || ov_fail "redis-cli --pipe failed"
grep -q 'errors: 0, replies: ' "$pipe_out" || ov_fail "redis-cli --pipe: $(tail -1 "$pipe_out")"
ov_log "ok: $(tail -1 "$pipe_out")"

# check_known <label>: reads every key back and compares with expected.txt.
check_known() {
  local got=$OV_TMP/got-$1.txt
  cli --raw <"$OV_TMP/get.txt" >"$got" 2>"$OV_TMP/got-$1.err" || ov_fail "redis-cli read-back failed ($1)"
  if ! cmp -s "$OV_TMP/expected.txt" "$got"; then
    echo "first differences ($1), line numbers match get.txt:" >&2
    diff <(cut -c1-80 "$OV_TMP/expected.txt") <(cut -c1-80 "$got") | head -20 >&2 || true
    head -3 "$OV_TMP/got-$1.err" >&2
    ov_fail "read-back $1: values differ from what was written"
  fi
  ov_log "ok: read-back $1: all $nexp replies match"
}
check_known after-load

# --- 3. DEBUG RELOAD: save, drop everything, load it again ----------------------------
r=$(cli DEBUG RELOAD 2>&1)
[[ "$r" == OK ]] || ov_fail "DEBUG RELOAD answered: $r"
ov_log "ok: DEBUG RELOAD, dbsize $(cli DBSIZE)"
check_known after-reload

# --- 4. INFO memory ---------------------------------------------------------------------
info=$(cli INFO memory | tr -d '\r')
used=$(sed -n 's/^used_memory://p' <<<"$info")
[[ "$used" =~ ^[0-9]+$ ]] && ((used > 0)) || ov_fail "INFO memory has no used_memory: $(head -c 300 <<<"$info")"
ov_log "ok: INFO memory: used_memory=$used ($(sed -n 's/^used_memory_human://p' <<<"$info")), rss $(sed -n 's/^used_memory_rss_human://p' <<<"$info"), $(grep '^mem_allocator:' <<<"$info" || true)"
ov_log "    allocator (mallctl): $(grep -E '^allocator_(allocated|active|resident|frag_ratio):' <<<"$info" | tr '\n' ' ' || true)"
# The jemalloc introspection entry points, through Redis.
r=$(cli MEMORY PURGE 2>&1)
[[ "$r" == OK ]] || ov_fail "MEMORY PURGE answered: $r"
ms=$(cli MEMORY MALLOC-STATS 2>&1 | head -c 100000 || true)
((${#ms} > 100)) || ov_fail "MEMORY MALLOC-STATS answered: $ms"
ov_log "ok: MEMORY PURGE, MEMORY MALLOC-STATS (${#ms} bytes: $(grep -m1 -E '^(Allocator|Version):' <<<"$ms" || head -1 <<<"$ms"))"

# --- 5. FLUSHALL ASYNC: the lazy-free thread frees what the main thread allocated -----
r=$(cli FLUSHALL ASYNC)
[[ "$r" == OK ]] || ov_fail "FLUSHALL ASYNC answered: $r"
deadline=$((SECONDS + 30))
while :; do
  pend=$(cli INFO memory | tr -d '\r' | sed -n 's/^lazyfree_pending_objects://p')
  [[ "$(cli DBSIZE)" == 0 && "$pend" == 0 ]] && break
  ((SECONDS < deadline)) || ov_fail "FLUSHALL ASYNC: still dbsize $(cli DBSIZE), $pend pending after 30s"
  sleep 0.2
done
[[ "$(cli GET ov:str:1)" == "" ]] || ov_fail "ov:str:1 still present after FLUSHALL"
ov_log "ok: FLUSHALL ASYNC done, used_memory=$(cli INFO memory | tr -d '\r' | sed -n 's/^used_memory://p')"

# --- 6. clean stop, then (b) the exit statistics ----------------------------------------
redis_stop
