#!/usr/bin/env bash
# Override test: Debian's MariaDB server (mariadbd) under LD_PRELOAD=<libkeel.so>.
#   - mariadb-install-db bootstraps a throw-away data directory (also under the preload);
#   - mariadbd on 127.0.0.1:<free port> + a socket in the throw-away dir;
#   - sysbench oltp_read_write (2 tables x 10000 rows, 4 threads, 15 s):
#     prepare, run (transactions > 0, no errors but InnoDB deadlocks, no reconnects),
#     CHECK TABLE + row counts + a sort-heavy join, cleanup;
#   - SIGTERM gives a clean shutdown (exit status 0, "Shutdown complete").
# Plus the proofs that Keel was the allocator: /proc/<pid>/maps and KEEL_STATS=1 output.
#
# Usage: bash tests/override/mariadb.sh /path/to/libkeel.so
# SYSBENCH_TIME=<seconds> changes the length of the run (default 15).
OV_NAME=mariadb
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"

MARIADBD=${MARIADBD:-/usr/sbin/mariadbd}
ov_need_server "$MARIADBD"
ov_need_tool mariadb-install-db mariadb sysbench
ov_init "$@"

port=$(ov_free_port)
data=$OV_TMP/data
sock=$OV_TMP/mariadb.sock
err_log=$OV_TMP/mariadbd.err
out_log=$OV_TMP/mariadbd.out
run_time=${SYSBENCH_TIME:-15}
user_opt=()
[[ $(id -u) -eq 0 ]] && user_opt=(--user=root)

# Small, fast, self-contained: nothing from /etc/mysql (--no-defaults), no binlog,
# no fsync per commit (this tests the allocator, not the disk).
server_opts=(
  --datadir="$data" --tmpdir="$OV_TMP" --socket="$sock" --port="$port"
  --bind-address=127.0.0.1 --pid-file="$OV_TMP/mariadbd.pid" --skip-name-resolve
  --innodb-buffer-pool-size=64M --innodb-log-file-size=32M
  --innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 --skip-log-bin
  --max-connections=64 --performance-schema=OFF
)

ov_log "mariadb-install-db (under the preload)"
inst_log=$OV_TMP/install-db.log
OV_LOGS+=("$inst_log")
ov_run -o "$inst_log" env LD_PRELOAD="$OV_LIB" timeout -k 5 120 mariadb-install-db --no-defaults \
  "${user_opt[@]}" --datadir="$data" --auth-root-authentication-method=normal --skip-test-db \
  --innodb-buffer-pool-size=64M --innodb-log-file-size=32M ||
  ov_fail "mariadb-install-db failed (status $?)"

ov_log "starting mariadbd on 127.0.0.1:$port"
env LD_PRELOAD="$OV_LIB" KEEL_STATS=1 "$MARIADBD" --no-defaults "${user_opt[@]}" "${server_opts[@]}" \
  </dev/null >"$out_log" 2>"$err_log" &
mpid=$!
ov_register "$mpid" mariadbd "$err_log" "$out_log"

sql() { timeout 60 mariadb --no-defaults --protocol=socket -S "$sock" -u root -N -B "$@"; }
alive() { [[ "$(sql -e 'SELECT 1' 2>/dev/null)" == 1 ]]; }
ov_wait_for 60 "$mpid" mariadbd alive
ov_log "mariadbd (pid $mpid) answers: $(sql -e 'SELECT VERSION()')"

# (a) the library is mapped in the server.
ov_check_maps "$mpid" mariadbd

sql -e "CREATE DATABASE sbtest;
        CREATE USER 'sbtest'@'127.0.0.1' IDENTIFIED BY 'sbtest';
        GRANT ALL PRIVILEGES ON sbtest.* TO 'sbtest'@'127.0.0.1';" ||
  ov_fail "could not create the sysbench user and database"

sb=(sysbench oltp_read_write --db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$port"
    --mysql-user=sbtest --mysql-password=sbtest --mysql-db=sbtest
    --tables=2 --table-size=10000)

ov_log "sysbench prepare (2 tables x 10000 rows)"
OV_LOGS+=("$OV_TMP/sb-prepare.txt")
ov_run -o "$OV_TMP/sb-prepare.txt" timeout -k 5 120 "${sb[@]}" --threads=2 prepare ||
  ov_fail "sysbench prepare failed (status $?)"

ov_log "sysbench run (4 threads, ${run_time}s)"
run_out=$OV_TMP/sb-run.txt
OV_LOGS+=("$run_out")
ov_run -o "$run_out" timeout -k 5 $((run_time + 60)) "${sb[@]}" --threads=4 --time="$run_time" \
  --report-interval=5 run || ov_fail "sysbench run failed (status $?)"
sed -n '/SQL statistics/,/Latency/p' "$run_out" | grep -E 'transactions:|queries:|ignored errors:|reconnects:' |
  sed 's/^ */    /'
tx=$(sed -n 's/^ *transactions: *\([0-9]*\) .*/\1/p' "$run_out")
errs=$(sed -n 's/^ *ignored errors: *\([0-9]*\) .*/\1/p' "$run_out")
reco=$(sed -n 's/^ *reconnects: *\([0-9]*\) .*/\1/p' "$run_out")
[[ "$tx" =~ ^[0-9]+$ ]] && ((tx > 0)) || ov_fail "sysbench reported no transactions"
# sysbench "ignores" (retries) only deadlocks (1213), lock wait timeouts (1205) and
# 1020; InnoDB may legitimately pick a deadlock victim now and then with 4 threads on
# 2 x 10000 rows. Those are accepted, and only if InnoDB itself counted them; any other
# error makes sysbench stop with a non-zero status, caught above.
[[ "$errs" =~ ^[0-9]+$ ]] || ov_fail "sysbench printed no 'ignored errors' count"
if ((errs > 0)); then
  st=$(sql -e "SELECT SUM(VARIABLE_VALUE) FROM information_schema.GLOBAL_STATUS
               WHERE VARIABLE_NAME IN ('INNODB_DEADLOCKS', 'INNODB_ROW_LOCK_TIMEOUTS')")
  [[ "$st" =~ ^[0-9]+$ ]] && ((errs <= st)) ||
    ov_fail "sysbench reported $errs ignored errors, but InnoDB counted only ${st:-?} deadlocks + lock wait timeouts"
  ((errs * 100 <= tx)) || ov_fail "sysbench reported $errs ignored errors for $tx transactions (more than 1%)"
  ov_log "note: $errs transaction(s) retried after InnoDB deadlocks/lock wait timeouts (InnoDB counted $st)"
fi
[[ "$reco" == 0 ]] || ov_fail "sysbench reported $reco reconnects (server restarted or dropped connections?)"
grep -qiE 'FATAL|ALERT' "$run_out" && ov_fail "sysbench printed FATAL/ALERT lines"
ov_log "ok: $tx transactions, $errs ignored (deadlock) errors, 0 reconnects"

# The data must still be consistent after the run (the workload keeps the row count).
chk=$(sql -e 'CHECK TABLE sbtest.sbtest1, sbtest.sbtest2 EXTENDED' | awk '$3 == "status" {print $4}' | sort -u)
[[ "$chk" == OK ]] || ov_fail "CHECK TABLE: $(sql -e 'CHECK TABLE sbtest.sbtest1, sbtest.sbtest2')"
counts=$(sql -e 'SELECT (SELECT COUNT(*) FROM sbtest.sbtest1), (SELECT COUNT(*) FROM sbtest.sbtest2)')
[[ "$counts" == $'10000\t10000' ]] || ov_fail "row counts after the run: $counts (expected 10000 10000)"
# A memory-hungry query: sort and group by long strings (filesort and temporary tables).
agg=$(sql -e "SELECT COUNT(*), COUNT(DISTINCT c), SUM(LENGTH(pad)) FROM
              (SELECT a.c, CONCAT(a.pad, b.pad) AS pad FROM sbtest.sbtest1 a
               JOIN sbtest.sbtest2 b ON a.id = b.id ORDER BY a.c, b.pad) t")
[[ "$agg" =~ ^10000$'\t'[0-9]+$'\t'[0-9]+$ ]] || ov_fail "aggregate query returned: $agg"
ov_log "ok: CHECK TABLE OK, rows $counts, aggregate $agg"

ov_log "sysbench cleanup"
timeout -k 5 60 "${sb[@]}" cleanup >"$OV_TMP/sb-cleanup.txt" 2>&1 || ov_fail "sysbench cleanup failed"

# Clean stop, then (b) the exit statistics.
ov_running "$mpid" || ov_fail "mariadbd is gone"
ov_stop_checked "$mpid"
grep -q 'Shutdown complete' "$err_log" || ov_fail "mariadbd's log has no 'Shutdown complete'"
ov_check_stats "$err_log" mariadbd "$mpid"
