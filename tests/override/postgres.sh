#!/usr/bin/env bash
# Override test: Debian's PostgreSQL server under LD_PRELOAD=<libkeel.so>.
#   - initdb of a throw-away cluster (also under the preload);
#   - postgres on 127.0.0.1:<free port>, socket in the throw-away dir;
#   - pgbench -i -s 2, then pgbench -c 4 -j 2 -T 15 (tps reported, 0 failed transactions);
#   - amcheck of the pgbench indexes, row-count checks, a sort/hash-heavy query;
#   - SIGTERM gives a clean shutdown (exit status 0, "database system is shut down").
# Plus the proofs that Keel was the allocator: /proc/<postmaster pid>/maps and
# KEEL_STATS=1 output in the postmaster's stderr (the backends it forks inherit both).
#
# initdb and postgres refuse to run as root: as root the server runs as the `postgres`
# user (setpriv, which execs, so the pid we hold is the postmaster's); otherwise as the
# calling user.
#
# Usage: bash tests/override/postgres.sh /path/to/libkeel.so
# PG_BINDIR=<dir> picks the PostgreSQL installation (default: newest /usr/lib/postgresql/*/bin).
# PGBENCH_TIME=<seconds> changes the length of the run (default 15).
OV_NAME=postgres
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"

if [[ -z "${PG_BINDIR:-}" ]]; then
  PG_BINDIR=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
fi
ov_need_server "${PG_BINDIR:-/usr/lib/postgresql/VERSION/bin}/postgres"
ov_need_tool "$PG_BINDIR/initdb" "$PG_BINDIR/pgbench" "$PG_BINDIR/psql"
ov_init "$@"

run_time=${PGBENCH_TIME:-15}
port=$(ov_free_port)
pgroot=$OV_TMP/pg
data=$pgroot/data
sockdir=$pgroot/sock
err_log=$OV_TMP/postgres.err
out_log=$OV_TMP/postgres.out
mkdir -p "$pgroot" "$sockdir"

as_pg=()
dbuser=$(id -un)
if [[ $(id -u) -eq 0 ]]; then
  id postgres >/dev/null 2>&1 || ov_fail "running as root, but there is no 'postgres' user to run the server as"
  chown -R postgres: "$pgroot"
  as_pg=(setpriv --reuid=postgres --regid=postgres --init-groups --reset-env)
  dbuser=postgres
  setpriv --reuid=postgres --regid=postgres --init-groups test -w "$pgroot" ||
    ov_fail "user postgres cannot write $pgroot (is \$TMPDIR reachable by other users?)"
  # The server user must be able to open the library, or the preload is silently ignored.
  if ! setpriv --reuid=postgres --regid=postgres --init-groups test -r "$OV_LIB"; then
    mkdir -p "$OV_TMP/lib"
    cp "$OV_LIB" "$OV_TMP/lib/"
    OV_LIB=$OV_TMP/lib/$(basename "$OV_LIB")
    chmod 755 "$OV_TMP/lib"
    chmod 644 "$OV_LIB"
    ov_log "user postgres cannot read the library: using a copy, $OV_LIB"
  fi
fi
# Prefix that runs a command as the server user. setpriv and env exec, so a command
# started in the background with it keeps the pid of $!. --reset-env drops root's
# environment, so what the server needs is passed explicitly.
pgrun=(env)
if ((${#as_pg[@]})); then
  pgrun=("${as_pg[@]}" env -C "$OV_TMP" LANG=C.UTF-8 PATH=/usr/bin:/bin)
  # Keel's own knobs (KEEL_PURGE_DELAY=..., etc.) reach the server as in the other tests.
  for v in $(compgen -e | grep '^KEEL_' | grep -v '^KEEL_OVERRIDE_' || true); do
    pgrun+=("$v=${!v}")
  done
fi

ov_log "initdb (under the preload)"
init_log=$OV_TMP/initdb.log
OV_LOGS+=("$init_log")
ov_run -o "$init_log" "${pgrun[@]}" LD_PRELOAD="$OV_LIB" timeout -k 5 120 "$PG_BINDIR/initdb" \
  -D "$data" -U "$dbuser" -A trust -E UTF8 --locale=C.UTF-8 --no-sync ||
  ov_fail "initdb failed (status $?)"

ov_log "starting postgres on 127.0.0.1:$port"
"${pgrun[@]}" LD_PRELOAD="$OV_LIB" KEEL_STATS=1 "$PG_BINDIR/postgres" -D "$data" -k "$sockdir" \
  -p "$port" -c listen_addresses=127.0.0.1 -c shared_buffers=64MB -c max_connections=30 \
  -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c logging_collector=off \
  -c log_min_messages=warning -c work_mem=8MB -c maintenance_work_mem=64MB \
  </dev/null >"$out_log" 2>"$err_log" &
ppid_=$!
ov_register "$ppid_" postgres "$err_log" "$out_log"

psql_() { timeout 120 "$PG_BINDIR/psql" -X -q -h 127.0.0.1 -p "$port" -U "$dbuser" -d postgres -At -v ON_ERROR_STOP=1 "$@"; }
alive() { [[ "$(psql_ -c 'SELECT 1' 2>/dev/null)" == 1 ]]; }
ov_wait_for 60 "$ppid_" postgres alive
ov_log "postgres (pid $ppid_) answers: $(psql_ -c 'SHOW server_version')"

# (a) the library is mapped in the postmaster (the backends it forks inherit it).
ov_check_maps "$ppid_" "postgres (postmaster)"

pgb=("$PG_BINDIR/pgbench" -h 127.0.0.1 -p "$port" -U "$dbuser")
ov_log "pgbench -i -s 2"
OV_LOGS+=("$OV_TMP/pgbench-init.txt")
ov_run -o "$OV_TMP/pgbench-init.txt" timeout -k 5 120 "${pgb[@]}" -i -s 2 postgres ||
  ov_fail "pgbench -i failed (status $?)"

ov_log "pgbench -c 4 -j 2 -T $run_time"
run_out=$OV_TMP/pgbench-run.txt
OV_LOGS+=("$run_out")
ov_run -o "$run_out" timeout -k 5 $((run_time + 60)) "${pgb[@]}" -c 4 -j 2 -T "$run_time" -P 5 postgres ||
  ov_fail "pgbench run failed (status $?)"
grep -E '^(number of transactions actually processed|number of failed transactions|tps =)' "$run_out" |
  sed 's/^/    /'
tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$run_out" | tail -1)
processed=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$run_out")
failed=$(sed -n 's/^number of failed transactions: \([0-9]*\) .*/\1/p' "$run_out")
[[ -n "$tps" ]] || ov_fail "pgbench reported no tps"
[[ "$processed" =~ ^[0-9]+$ ]] && ((processed > 0)) || ov_fail "pgbench processed no transactions"
[[ "$failed" == 0 ]] || ov_fail "pgbench reported ${failed:-an unknown number of} failed transactions"
grep -qE '^pgbench: error|^pgbench: fatal|aborted in command' "$run_out" && ov_fail "pgbench reported errors"
ov_log "ok: tps $tps, $processed transactions, 0 failed"

# Consistency after the run: index structure (amcheck), row counts, a memory-hungry query.
psql_ -c "CREATE EXTENSION IF NOT EXISTS amcheck" >/dev/null 2>&1 && {
  psql_ -c "SELECT bt_index_check(c.oid, true) FROM pg_class c
            WHERE c.relname IN ('pgbench_accounts_pkey','pgbench_branches_pkey','pgbench_tellers_pkey')" \
    >/dev/null || ov_fail "amcheck found a corrupt pgbench index"
  ov_log "ok: amcheck bt_index_check of the pgbench indexes"
}
counts=$(psql_ -c "SELECT (SELECT count(*) FROM pgbench_accounts) || ' ' || (SELECT count(*) FROM pgbench_branches) || ' ' || (SELECT count(*) FROM pgbench_tellers)")
[[ "$counts" == "200000 2 20" ]] || ov_fail "row counts after the run: $counts (expected 200000 2 20)"
# Every transaction adds its delta to one account, teller and branch and logs it in
# history: the three sums must equal the history sum.
bal=$(psql_ -c "SELECT (SELECT sum(abalance) FROM pgbench_accounts) = (SELECT coalesce(sum(delta),0) FROM pgbench_history)
            AND (SELECT sum(bbalance) FROM pgbench_branches) = (SELECT coalesce(sum(delta),0) FROM pgbench_history)
            AND (SELECT sum(tbalance) FROM pgbench_tellers) = (SELECT coalesce(sum(delta),0) FROM pgbench_history)")
[[ "$bal" == t ]] || ov_fail "balances do not add up to the history (got '$bal')"
agg=$(psql_ -c "SET work_mem='64MB'; SELECT count(*), count(DISTINCT s) FROM
                (SELECT md5(aid::text) || repeat(filler, 2) AS s FROM pgbench_accounts ORDER BY 1 DESC) t" | tail -1)
[[ "$agg" == "200000|200000" ]] || ov_fail "sort/hash query returned '$agg' (expected 200000|200000)"
ov_log "ok: rows $counts, balances match the history, sort/distinct query $agg"

# Clean stop, then (b) the exit statistics.
ov_running "$ppid_" || ov_fail "postgres is gone"
ov_stop_checked "$ppid_"
grep -q 'database system is shut down' "$err_log" || ov_fail "postgres' log has no 'database system is shut down'"
ov_check_stats "$err_log" "postgres (postmaster)" "$ppid_"
