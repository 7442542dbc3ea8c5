#!/usr/bin/env bash
# Override test: meshing (KEEL_MESH=on, docs/meshing.md) keeps fork's meaning in Redis.
#
# Debian's redis-server runs under LD_PRELOAD=<libkeel.so> with meshing on. It gets
# 300,000 strings of 700-1024 bytes (deterministic content), a deterministic random half
# of them is deleted, and the purger must then mesh sparse pages: /proc/<pid>/maps shows
# at least 2,000 "memfd:keel-mesh" views. Then, under a write load (redis-benchmark
# SET/INCR/DEL on its own keys, and a writer keeping an exact model of its keys, which
# also rewrites surviving original strings in place with SETRANGE - writes into meshed
# pages), several saves in a row, each:
#   CLIENT PAUSE WRITE, DEBUG DIGEST (the data set as it is), BGSAVE, CLIENT UNPAUSE;
#   the save completes while both writers go on (checked with INFO commandstats);
#   redis-check-rdb accepts the dump; a second redis-server without libkeel loads it
#   and its DEBUG DIGEST equals the one taken at the pause.
# So the forked child wrote exactly the data set of fork time - through pages shared
# by views with the parent, which kept writing into them. At the end the live server
# matches the writer's model, a sample of the untouched original strings still holds
# their exact values and deleted keys stay deleted.
#
# Skipped (77) when redis-server is not installed, or when meshing stays off (it needs
# a userfaultfd write barrier that holds for kernel writes: root, CAP_SYS_PTRACE,
# /dev/userfaultfd access or vm.unprivileged_userfaultfd=1).
#
# Usage: bash tests/override/redis_mesh_bgsave.sh /path/to/libkeel.so
#        (KEEL_MESH_BGSAVE_ROUNDS=N: N saves instead of 10)
OV_NAME=redis_mesh_bgsave
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"
source "$here/../harness/redis_server.sh"

ov_need_server "$REDIS_SERVER"
ov_need_tool redis-cli redis-benchmark redis-check-rdb /usr/bin/python3
ov_init "$@"

NKEYS=300000    # original strings o:0000000..., 700-1024 bytes each
MIN_VIEWS=2000  # meshing must have made at least this many views before the saves
ROUNDS=${KEEL_MESH_BGSAVE_ROUNDS:-10} # saves (~6 s each on 2 cores)
PAUSE_MS=30000  # CLIENT PAUSE limit: only a safety net, every pause is ended by UNPAUSE

# --- the data and the writer (one python program, run with redis_python) ------------
py=$OV_TMP/mesh_data.py
cat >"$py" <<'PY'
"""Data for redis_mesh_bgsave.sh.
  load N            RESP on stdout: SET o:<i> <value(i)> for i < N
  delete N          RESP on stdout: DEL of a deterministic random half of them
  writer N PORT DIR until DIR/writer.stop exists: MSET on its keys m:<j> and SETRANGE on
                    3,000 surviving originals (in place), keeping an exact model of the
                    acknowledged writes; then checks the live server against the model,
                    20,000 untouched survivors and 5,000 deleted keys; exit 1 on a
                    difference."""
import os, random, socket, sys, time
from redis_resp import resp

ALNUM = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def okey(i):
    return b"o:%07d" % i


def fill(head, size, rot):
    base = head + ALNUM[rot:] + ALNUM[:rot]
    return (base * (size // len(base) + 1))[:size]


def value(i):
    h = (i * 2654435761) & 0xFFFFFFFF
    return fill(b"o:%d:" % i, 700 + h % 325, h % 62)


def deleted(n):
    return set(random.Random(20261123).sample(range(n), n // 2))


def mvalue(j, seq):
    return fill(b"m:%d:%d:" % (j, seq), 700 + (seq * 31 + j) % 325, seq % 62)


class Conn:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.f = self.sock.makefile("rb")

    def send(self, cmds):
        self.sock.sendall(b"".join(resp(*c) for c in cmds))

    def reply(self):
        line = self.f.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError("connection closed")
        t, rest = line[:1], line[1:-2]
        if t == b"+":
            return rest
        if t == b"-":
            raise RuntimeError("redis error: %s" % rest.decode(errors="replace"))
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            return None if n < 0 else self.f.read(n + 2)[:-2]
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise RuntimeError("bad reply line %r" % line[:80])

    def run(self, cmds):
        self.send(cmds)
        return [self.reply() for _ in cmds]


def show(b):
    return "absent" if b is None else "%d bytes %r" % (len(b), bytes(b[:40]))


def writer(n, port, d):
    survivors = sorted(set(range(n)) - deleted(n))
    rng = random.Random(7)
    targets = rng.sample(survivors, 3000)
    model = {okey(i): bytearray(value(i)) for i in targets}
    mkeys = [b"m:%04d" % j for j in range(1000)]
    model.update((k, None) for k in mkeys)
    c, seq, acked, ppid = Conn(port), 0, 0, os.getppid()
    stop = os.path.join(d, "writer.stop")
    t0 = time.time()
    while not os.path.exists(stop):
        if os.getppid() != ppid:
            sys.exit("writer: the test script is gone")
        cmds, effects = [], []
        for _ in range(32):
            seq += 1
            if seq % 2:
                j = rng.randrange(len(mkeys))
                v = mvalue(j, seq)
                cmds.append((b"MSET", mkeys[j], v))
                effects.append((mkeys[j], None, v))
            else:
                k = okey(rng.choice(targets))
                off = rng.randrange(len(model[k]) - 24)
                patch = b"<w%020d>" % seq
                cmds.append((b"SETRANGE", k, off, patch))
                effects.append((k, off, patch))
        for (k, off, v), r in zip(effects, c.run(cmds)):
            if off is None:
                assert r == b"OK", r
                model[k] = bytearray(v)
            else:
                assert r == len(model[k]), (k, r, len(model[k]))
                model[k][off:off + len(v)] = v
            acked += 1
        time.sleep(0.002)
    print("writer: %d writes acknowledged in %.1fs (MSET on %d keys, SETRANGE in place on "
          "%d originals)" % (acked, time.time() - t0, len(mkeys), len(targets)))

    bad = []
    def check(what, expect):  # expect: key -> bytes or None (absent)
        keys = list(expect)
        for s in range(0, len(keys), 500):
            for k, got in zip(keys[s:s + 500], c.run([(b"GET", k) for k in keys[s:s + 500]])):
                want = expect[k]
                if (got is None) != (want is None) or (got is not None and got != want):
                    bad.append("%s %s: expected %s, got %s" % (what, k.decode(), show(want), show(got)))
        print("writer: %s: %d keys checked" % (what, len(keys)))
    check("model", {k: None if v is None else bytes(v) for k, v in model.items()})
    untouched = sorted(set(survivors) - set(targets))
    check("untouched originals", {okey(i): value(i) for i in rng.sample(untouched, 20000)})
    check("deleted originals", {okey(i): None for i in rng.sample(sorted(deleted(n)), 5000)})
    for b in bad[:10]:
        print("writer: MISMATCH " + b)
    if bad:
        sys.exit("writer: %d keys differ" % len(bad))
    print("writer: all keys match")


def main():
    mode, n = sys.argv[1], int(sys.argv[2])
    out = sys.stdout.buffer
    if mode == "load":
        for s in range(0, n, 1000):
            out.write(b"".join(resp(b"SET", okey(i), value(i)) for i in range(s, min(n, s + 1000))))
    elif mode == "delete":
        gone = sorted(deleted(n))
        for s in range(0, len(gone), 100):
            out.write(resp(b"DEL", *[okey(i) for i in gone[s:s + 100]]))
    elif mode == "writer":
        writer(n, int(sys.argv[3]), sys.argv[4])
    else:
        sys.exit("unknown mode " + mode)


main()
PY

# mesh_views <pid>: the meshed views mapped in a process (lines of its maps).
mesh_views() { grep -c 'memfd:keel-mesh' "/proc/$1/maps" 2>/dev/null || true; }
meshing_off() { grep -h -m1 'meshing stays off' "$err_log" "$out_log" 2>/dev/null || true; }
info_field() { sed -n "s/^$2:\([^,]*\).*/\1/p" <<<"$1"; }
# write_counts: "<benchmark writes> <writer writes>" (calls of the commands each uses).
write_counts() {
  local cs
  cs=$(cli INFO commandstats | tr -d '\r')
  calls() { sed -n "s/^cmdstat_$1:calls=\([0-9]*\),.*/\1/p" <<<"$cs"; }
  echo $(($(calls set) + $(calls incr) + $(calls del) + 0)) $(($(calls mset) + $(calls setrange) + 0))
}

# --- 1. the server, meshing on ----------------------------------------------------------
KEEL_MESH=on redis_start
# The purger looks at meshing on its first tick (250 ms) and warns if it must stay off.
sleep 1.5
off=$(meshing_off)
[[ -z "$off" ]] || ov_skip "meshing stays off here (not root?): $off"

# --- 2. the data set, then a random half deleted ---------------------------------------
ov_log "loading $NKEYS strings of 700-1024 bytes (redis-cli --pipe)"
pipe_out=$OV_TMP/pipe-load.txt
OV_LOGS+=("$pipe_out")
redis_python "$py" load "$NKEYS" | cli --pipe >"$pipe_out" 2>&1 || ov_fail "loading failed"
grep -q 'errors: 0, replies: ' "$pipe_out" || ov_fail "load: $(tail -1 "$pipe_out")"
ov_log "ok: $(tail -1 "$pipe_out"), dbsize $(cli DBSIZE)"
pipe_out=$OV_TMP/pipe-delete.txt
OV_LOGS+=("$pipe_out")
redis_python "$py" delete "$NKEYS" | cli --pipe >"$pipe_out" 2>&1 || ov_fail "deleting failed"
grep -q 'errors: 0, replies: ' "$pipe_out" || ov_fail "delete: $(tail -1 "$pipe_out")"
dbsize=$(cli DBSIZE)
((dbsize == NKEYS - NKEYS / 2)) || ov_fail "dbsize $dbsize after deleting half of $NKEYS"
ov_log "ok: deleted half, dbsize $dbsize, rss $(cli INFO memory | tr -d '\r' | sed -n 's/^used_memory_rss_human://p')"

# --- 3. meshing happens ---------------------------------------------------------------
deadline=$((SECONDS + 40))
while :; do
  views=$(mesh_views "$rpid")
  ((views >= MIN_VIEWS)) && break
  off=$(meshing_off)
  [[ -z "$off" ]] || ov_skip "meshing stays off here: $off"
  ov_running "$rpid" || ov_fail "redis-server died while meshing"
  ((SECONDS < deadline)) ||
    ov_fail "only $views keel-mesh views in /proc/$rpid/maps after 40s (want $MIN_VIEWS)"
  sleep 0.5
done
ov_log "ok: $views keel-mesh views, rss $(cli INFO memory | tr -d '\r' | sed -n 's/^used_memory_rss_human://p')"

# --- 4. saves under a write load ---------------------------------------------------------
# redis-benchmark: SET (900-byte values) and INCR on key:*/counter:*, DEL of key:*, until
# stopped; the writer: MSET/SETRANGE with its model (above).
# start_bg <label> <log> <command...>: a load process, stopped at exit whatever happens;
# sets bg_pid. (The writer runs in a subshell of redis_python: it ends by itself when
# that subshell is stopped.)
start_bg() {
  local what=$1 log=$2
  shift 2
  "$@" </dev/null >"$log" 2>&1 &
  bg_pid=$!
  ov_register "$bg_pid" "$what" "$log"
}
start_bg "redis-benchmark set,incr" "$OV_TMP/bench-set.txt" redis-benchmark \
  -h 127.0.0.1 -p "$port" -t set,incr -r 100000 -d 900 -n 200000 -c 4 -P 4 -q -l
bench_set=$bg_pid
start_bg "redis-benchmark del" "$OV_TMP/bench-del.txt" redis-benchmark \
  -h 127.0.0.1 -p "$port" -r 100000 -n 200000 -c 2 -P 4 -q -l DEL key:__rand_int__
bench_del=$bg_pid
wlog=$OV_TMP/writer.txt
start_bg writer "$wlog" redis_python "$py" writer "$NKEYS" "$port" "$OV_TMP"
writer=$bg_pid
sleep 2
for p in "$bench_set" "$bench_del" "$writer"; do
  ov_running "$p" || ov_fail "${OV_PID_WHAT[$p]} ended at once"
done
read -r b0 w0 <<<"$(write_counts)"
((b0 > 0 && w0 > 0)) || ov_fail "no writes from the load after 2s (benchmark $b0, writer $w0)"
ov_log "write load running: benchmark $b0 writes, writer $w0 writes so far"

plain_port=""
plain_ping_ok() { port=$plain_port redis_ping_ok; }
# plain_digest <dir>: sets loaded to the DEBUG DIGEST of <dir>/dump.rdb loaded by a
# redis-server without libkeel (the binary's own allocator).
plain_digest() {
  local dir=$1 pid
  plain_port=$(ov_free_port)
  env -u LD_PRELOAD "$REDIS_SERVER" --bind 127.0.0.1 --port "$plain_port" \
    --protected-mode yes --save '' --appendonly no --dir "$dir" --dbfilename dump.rdb \
    --daemonize no --supervised no --logfile '' --enable-debug-command local \
    >"$dir/plain.log" 2>&1 </dev/null &
  pid=$!
  ov_register "$pid" "redis-server without libkeel" "$dir/plain.log"
  ov_wait_for 60 "$pid" "redis-server without libkeel" plain_ping_ok
  loaded=$(port=$plain_port cli DEBUG DIGEST)
  ov_stop "$pid"
  ((OV_STOP_STATUS == 0)) || ov_fail "redis-server without libkeel exited with status $OV_STOP_STATUS"
}

summary=()
for ((r = 1; r <= ROUNDS; r++)); do
  ov_running "$rpid" || ov_fail "redis-server died"
  saves0=$(info_field "$(cli INFO persistence | tr -d '\r')" rdb_saves)
  t0=$(date +%s%N)
  [[ "$(cli CLIENT PAUSE "$PAUSE_MS" WRITE)" == OK ]] || ov_fail "CLIENT PAUSE failed"
  digest=$(cli DEBUG DIGEST)
  views=$(mesh_views "$rpid") # (the purger may still mesh: not a write to the data set)
  reply=$(cli BGSAVE)
  [[ "$(cli CLIENT UNPAUSE)" == OK ]] || ov_fail "CLIENT UNPAUSE failed"
  paused_ms=$((($(date +%s%N) - t0) / 1000000))
  [[ "$reply" == "Background saving started" ]] || ov_fail "round $r: BGSAVE answered: $reply"
  ((paused_ms < PAUSE_MS)) || ov_fail "round $r: the pause (${paused_ms} ms) outlasted CLIENT PAUSE $PAUSE_MS"
  [[ "$digest" =~ ^[0-9a-f]{40}$ && "$digest" != 0000000000000000000000000000000000000000 ]] ||
    ov_fail "round $r: DEBUG DIGEST answered: $digest"
  ((views >= MIN_VIEWS / 2)) || ov_fail "round $r: only $views keel-mesh views left at the save"
  read -r b1 w1 <<<"$(write_counts)"

  # The save runs while the load goes on; the child's maps show the views it inherited.
  child_views=""
  deadline=$((SECONDS + 60))
  while :; do
    info=$(cli INFO persistence | tr -d '\r')
    [[ "$(info_field "$info" rdb_bgsave_in_progress)" == 0 ]] && break
    if [[ -z "$child_views" ]]; then
      for c in $(ps -o pid= --ppid "$rpid" 2>/dev/null || true); do
        child_views=$(mesh_views "$c")
      done
    fi
    ((SECONDS < deadline)) || ov_fail "round $r: BGSAVE still running after 60s"
    sleep 0.1
  done
  save_ms=$((($(date +%s%N) - t0) / 1000000 - paused_ms))
  read -r b2 w2 <<<"$(write_counts)"
  [[ "$(info_field "$info" rdb_last_bgsave_status)" == ok ]] ||
    ov_fail "round $r: rdb_last_bgsave_status $(info_field "$info" rdb_last_bgsave_status)"
  (($(info_field "$info" rdb_saves) == saves0 + 1)) ||
    ov_fail "round $r: rdb_saves went from $saves0 to $(info_field "$info" rdb_saves)"
  ((b2 > b1 && w2 > w1)) ||
    ov_fail "round $r: writes stopped during the save (benchmark +$((b2 - b1)), writer +$((w2 - w1)))"

  dir=$OV_TMP/round$r
  mkdir "$dir"
  mv "$OV_TMP/data/dump.rdb" "$dir/dump.rdb"
  OV_LOGS+=("$dir/check-rdb.txt")
  redis-check-rdb "$dir/dump.rdb" >"$dir/check-rdb.txt" 2>&1 ||
    ov_fail "round $r: redis-check-rdb rejects the dump"
  grep -q 'RDB looks OK' "$dir/check-rdb.txt" || ov_fail "round $r: redis-check-rdb: $(tail -1 "$dir/check-rdb.txt")"
  keys=$(sed -n 's/^\[info\] \([0-9]*\) keys read.*/\1/p' "$dir/check-rdb.txt" | head -1)
  plain_digest "$dir"
  [[ "$loaded" == "$digest" ]] ||
    ov_fail "round $r: DIGEST MISMATCH: at the pause $digest, the dump loaded without libkeel $loaded"
  line="round $r: digest $digest = dump's; views $views (child ${child_views:-?}); save ${save_ms} ms, writes during it: benchmark +$((b2 - b1)), writer +$((w2 - w1)); rdb ${keys:-?} keys, $(stat -c %s "$dir/dump.rdb") bytes"
  ov_log "ok: $line"
  summary+=("$line")
  rm -rf "$dir"
done

# --- 5. stop the load; the live server against the model and the originals -------------
for p in "$bench_set" "$bench_del"; do ov_stop "$p"; done
touch "$OV_TMP/writer.stop"
deadline=$((SECONDS + 60))
while ov_running "$writer" && ((SECONDS < deadline)); do sleep 0.2; done
ov_stop "$writer" # reaps it (SIGTERM only if it hung) and gives its status
sed 's/^/    /' "$wlog"
((OV_STOP_STATUS == 0)) || ov_fail "writer: status $OV_STOP_STATUS: the live server differs from the model"
grep -qi 'error' "$OV_TMP/bench-set.txt" "$OV_TMP/bench-del.txt" && ov_fail "redis-benchmark reported errors"
ov_log "ok: live server matches the writer's model and the original strings; $(mesh_views "$rpid") keel-mesh views now"
printf '    %s\n' "${summary[@]}"

redis_stop
