#!/usr/bin/env bash
# jemalloc API test: Debian's redis-server, which is linked to libjemalloc.so.2, under
# LD_PRELOAD=<libkeel.so>. Its malloc/free come to Keel by the preload; since Keel also
# exports mallctl, nallocx and malloc_stats_print (src/api/jemalloc_compat.c, mallctl.c, stats_print.c), its
# allocator introspection must come to Keel too, not to the idle jemalloc:
#   - INFO memory: allocator_allocated/active/resident are Keel's figures (allocated
#     close to Redis' own used_memory; jemalloc's would be near zero here);
#   - MEMORY STATS, MEMORY DOCTOR, MEMORY MALLOC-STATS (Keel's malloc_stats_print),
#     MEMORY PURGE (arena.<narenas>.purge -> keel_purge: resident drops after FLUSHALL);
#   - DEBUG MALLCTL / MALLCTL-STR (version names Keel, stats.allocated);
#   - a clean SIGTERM exit with Keel's KEEL_STATS=1 exit statistics.
# The server is always stopped by PID (tests/override/common.sh,
# tests/harness/redis_server.sh).
#
# Usage: bash tests/jemalloc/redis_jemalloc.sh /path/to/libkeel.so
OV_NAME=jemalloc-redis
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for f in override/common.sh harness/redis_server.sh; do
  if [[ ! -f "$here/../$f" ]]; then
    echo "[$OV_NAME] SKIP: tests/$f (the server helpers) is missing"
    exit 77
  fi
done
source "$here/../override/common.sh"
source "$here/../harness/redis_server.sh"

ov_need_server "$REDIS_SERVER"
ov_need_tool redis-cli /usr/bin/python3
"$REDIS_SERVER" --version | grep -q 'malloc=jemalloc' ||
  ov_skip "$REDIS_SERVER is not built with jemalloc: $("$REDIS_SERVER" --version)"
je_api='mallctl|mallctlnametomib|mallctlbymib|malloc_stats_print|nallocx'
je_api+='|mallocx|rallocx|xallocx|sallocx|dallocx|sdallocx'
imports=$(nm -D --undefined-only "$REDIS_SERVER" 2>/dev/null | awk '{print $NF}' |
  grep -E "^($je_api)\$" | tr '\n' ' ' || true)
ov_init "$@"
ov_log "jemalloc API symbols $REDIS_SERVER imports: ${imports:-none found (stripped?)}"
for sym in $imports; do
  nm -D --defined-only "$OV_LIB" | awk '{print $NF}' | grep -qx "$sym" ||
    ov_fail "redis-server imports $sym but $OV_LIB does not export it"
done

redis_start

# field <name> <text>: the value of "name:value" (INFO) lines.
field() { sed -n "s/^$1://p" <<<"$2" | head -1; }
info_mem() { cli INFO memory | tr -d '\r'; }
# Redis refreshes its allocator_* figures (mallctl "epoch", then stats.*) in serverCron,
# every 100 ms: INFO shows the last refresh. settled_info <condition>: INFO memory once
# the condition (bash arithmetic on $used, $alloc, $active, $resident) holds, or after 10 s.
settled_info() {
  local deadline=$((SECONDS + 10))
  while :; do
    info=$(info_mem)
    used=$(field used_memory "$info")
    alloc=$(field allocator_allocated "$info")
    active=$(field allocator_active "$info")
    resident=$(field allocator_resident "$info")
    [[ "$used$alloc$active$resident" =~ ^[0-9]+$ ]] && (($1)) && return 0
    ((SECONDS < deadline)) || return 0
    sleep 0.2
  done
}

# --- the allocator answering mallctl is Keel ------------------------------------------
ver=$(cli DEBUG MALLCTL-STR version)
[[ "$ver" == *keel* ]] || ov_fail "DEBUG MALLCTL-STR version = '$ver': mallctl is not Keel's"
ov_log "ok: DEBUG MALLCTL-STR version = $ver"

# --- a data set: 150k small strings, hashes, and some values of 200 KiB - 2 MiB ---------
r=$(cli DEBUG POPULATE 150000 key 300) || ov_fail "DEBUG POPULATE failed"
[[ "$r" == OK ]] || ov_fail "DEBUG POPULATE answered: $r"
redis_python - "$OV_TMP/big.resp" <<'PY'
import sys
from redis_resp import resp
out = open(sys.argv[1], "wb")
for i in range(24):
    size = (200 << 10) + i * (80 << 10)          # 200 KiB .. ~2 MiB: large and huge blocks
    out.write(resp(b"SET", b"big:%d" % i, bytes([65 + i % 26]) * size))
for h in range(2000):
    fields = [x for f in range(20) for x in (b"f%d" % f, b"v" * (10 + f * 7))]
    out.write(resp(b"HSET", b"hash:%d" % h, *fields))
PY
cli --pipe <"$OV_TMP/big.resp" >"$OV_TMP/pipe.txt" 2>&1 || ov_fail "redis-cli --pipe failed"
grep -q 'errors: 0' "$OV_TMP/pipe.txt" || ov_fail "redis-cli --pipe: $(tail -1 "$OV_TMP/pipe.txt")"
ov_log "ok: data set loaded, dbsize $(cli DBSIZE)"

# --- INFO memory ------------------------------------------------------------------------
settled_info 'alloc >= used * 9 / 10'
echo "    INFO memory (allocator lines):"
grep -E '^(used_memory|used_memory_rss|allocator_[a-z_]+|rss_overhead_[a-z]+|mem_fragmentation_[a-z]+|mem_allocator):' \
  <<<"$info" | sed 's/^/      /'
for v in used alloc active resident; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || ov_fail "INFO memory: no number for $v: $(head -c 400 <<<"$info")"
done
((used > 50000000)) || ov_fail "used_memory $used: the data set did not load?"
# Redis counts the usable size of every block it allocated; Keel's stats.allocated counts
# every live block in the process: the two must be close (jemalloc, idle under the
# preload, would report almost nothing).
((alloc >= used * 9 / 10 && alloc <= used * 13 / 10 + 8000000)) ||
  ov_fail "allocator_allocated $alloc is not Keel's figure for used_memory $used"
((active >= alloc)) || ov_fail "allocator_active $active < allocator_allocated $alloc"
((resident >= active)) || ov_fail "allocator_resident $resident < allocator_active $active"
ov_log "ok: allocator_allocated $alloc ~ used_memory $used; active $active, resident $resident"
ma=$(cli DEBUG MALLCTL stats.allocated)
[[ "$ma" =~ ^[0-9]+$ ]] && ((ma >= used * 9 / 10)) || ov_fail "DEBUG MALLCTL stats.allocated = '$ma'"
ov_log "ok: DEBUG MALLCTL stats.allocated = $ma"

# --- MEMORY STATS / DOCTOR / MALLOC-STATS -----------------------------------------------
stats=$(cli MEMORY STATS | tr -d '\r')
sa=$(grep -A1 -x 'allocator.allocated' <<<"$stats" | tail -1)
sfr=$(grep -A1 -x 'allocator-fragmentation.ratio' <<<"$stats" | tail -1)
[[ "$sa" =~ ^[0-9]+$ ]] && ((sa >= used * 9 / 10)) ||
  ov_fail "MEMORY STATS allocator.allocated = '$sa': $(head -c 600 <<<"$stats")"
[[ "$sfr" =~ ^[0-9.]+$ ]] || ov_fail "MEMORY STATS allocator-fragmentation.ratio = '$sfr'"
ov_log "ok: MEMORY STATS allocator.allocated $sa, allocator-fragmentation.ratio $sfr"
doctor=$(cli MEMORY DOCTOR | tr -d '\r')
[[ -n "$doctor" && "$doctor" != ERR* ]] || ov_fail "MEMORY DOCTOR: '$doctor'"
ov_log "ok: MEMORY DOCTOR: $(head -c 160 <<<"$doctor")"
ms=$(cli MEMORY MALLOC-STATS | tr -d '\r')
grep -q '^___ Begin jemalloc statistics ___' <<<"$ms" && grep -q '^Allocator: keel' <<<"$ms" &&
  grep -q '^--- End jemalloc statistics ---' <<<"$ms" ||
  ov_fail "MEMORY MALLOC-STATS is not Keel's: $(head -c 400 <<<"$ms")"
ov_log "ok: MEMORY MALLOC-STATS: $(grep '^Allocated:' <<<"$ms")"

# --- FLUSHALL, MEMORY PURGE: Keel gives the memory back ------------------------------------
r=$(cli FLUSHALL SYNC)
[[ "$r" == OK ]] || ov_fail "FLUSHALL answered: $r"
r=$(cli MEMORY PURGE)
[[ "$r" == OK ]] || ov_fail "MEMORY PURGE answered: $r"
alloc1=$alloc resident1=$resident
settled_info "alloc < $alloc1 / 4 && resident < $resident1 / 2"
alloc2=$alloc resident2=$resident used2=$used alloc=$alloc1 resident=$resident1
((alloc2 < alloc / 4)) || ov_fail "allocator_allocated $alloc -> $alloc2 after FLUSHALL"
((resident2 < resident / 2)) ||
  ov_fail "allocator_resident $resident -> $resident2 after FLUSHALL + MEMORY PURGE"
ov_log "ok: after FLUSHALL + MEMORY PURGE: used_memory $used2, allocator_allocated $alloc2," \
  "allocator_resident $resident -> $resident2"

# --- a little more traffic on the emptied server, then a clean stop ------------------------
r=$(cli DEBUG POPULATE 20000 again 100)
[[ "$r" == OK ]] || ov_fail "DEBUG POPULATE (second) answered: $r"
redis_stop
