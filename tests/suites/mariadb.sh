#!/usr/bin/env bash
# MariaDB's own test suite (mysql-test-run, Debian's mariadb-test) with a given malloc.
#
# Usage: bash tests/suites/mariadb.sh <quick|full> <libkeel.so|glibc> <result.json>
#   quick  a fixed list of ~60 tests from the main, innodb and json suites (~1-2 min): joins,
#          sorts, subqueries, temporary tables, ALTER, triggers, stored procedures, JSON,
#          character sets, InnoDB
#   full   the main and json suites (KEEL_SUITES_MTR_SUITES=main,innodb,json for more)
# Everything mtr starts inherits LD_PRELOAD: mariadbd, the mariadb-test client, perl.
# mtr runs as root here, so servers get --user=root; --force --retry=0 (every failure is
# counted, none hidden by a retry), --parallel=2, tests Debian marks unstable on amd64
# skipped (both allocators alike). While it runs, every mariadbd that mtr started is
# checked to map the preloaded library (/proc/PID/maps).
# Writes <result.json> (pass/fail/skipped counts, failing tests, seconds) and a log.
# Exit status: 0 if no test failed, 1 otherwise, 77 if mariadb-test is not installed.
set -uo pipefail
mode=${1:?quick|full} lib=${2:?libkeel.so or glibc} out=${3:?result.json}
mtr_dir=/usr/share/mysql/mysql-test
[[ -f $mtr_dir/mariadb-test-run.pl ]] || { echo "SKIP: mariadb-test not installed"; exit 77; }

quick=(main.1st main.alias main.alter_table main.create main.ctype_utf8 main.ctype_utf8mb4
       main.derived main.distinct main.func_group main.func_str main.func_json main.group_by
       main.having main.insert_select main.join main.join_outer main.order_by main.select
       main.subselect main.subselect_sj main.temp_table main.trigger main.sp main.union
       main.view main.func_math main.type_blob main.myisam innodb.innodb innodb.innodb-index
       main.information_schema main.filesort_debug main.partition main.group_min_max
       main.range main.func_time main.ps main.multi_update main.fulltext
       main.ctype_ucs main.sum_distinct main.win main.cte_recursive main.gis main.opt_trace
       main.selectivity main.statistics main.analyze_stmt main.sp-big main.func_regexp
       main.type_json main.dyncol json.json_table json.json_no_table innodb.innodb_mysql
       innodb.innodb-autoinc innodb.innodb_bug30423 innodb.temporary_table main.max_statement_time)
suites=${KEEL_SUITES_MTR_SUITES:-main,json}

work=$(mktemp -d "${TMPDIR:-/tmp}/keel-suites-mtr.XXXXXX")
sampler=""
cleanup() {
  [[ -n $sampler ]] && kill "$sampler" 2>/dev/null && wait "$sampler" 2>/dev/null
  # mtr stops its servers itself; anything left under our vardir is stopped by PID.
  local p
  for p in $(pgrep -f -- "$work/var" 2>/dev/null); do kill -TERM "$p" 2>/dev/null; done
  sleep 1
  for p in $(pgrep -f -- "$work/var" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

skip=$work/skip.txt
# mtr's format: "suite.test : comment".
cat "$mtr_dir/unstable-tests" "$mtr_dir/unstable-tests.$(dpkg --print-architecture 2>/dev/null)" 2>/dev/null |
  grep -E '^[-0-9A-Za-z_/]+\.[-0-9A-Za-z_#*]+ *: *' >"$skip"

envp=(env)
if [[ $lib != glibc ]]; then
  lib=$(readlink -f "$lib")
  [[ -f $lib ]] || { echo "no such library: $lib"; exit 1; }
  envp+=(LD_PRELOAD="$lib")
  # Every mariadbd mtr starts must map the library: sample once a second.
  (
    seen=0 bad=0
    declare -A done_pids=()
    while :; do
      for p in $(pgrep -x mariadbd 2>/dev/null); do
        [[ -n ${done_pids[$p]:-} ]] && continue
        grep -q -- "$work/var" "/proc/$p/cmdline" 2>/dev/null || continue
        # Judged once the loader has mapped libc (preloads come before it): a process
        # caught just after exec, or exiting (empty maps), is looked at again next time.
        maps=$(cat "/proc/$p/maps" 2>/dev/null)
        [[ $maps == *libc.so* ]] || continue
        done_pids[$p]=1
        # A read of maps is not one snapshot (Linux 6.18 reads it without the mmap lock,
        # page by page): one without the library is read again. A process cannot map a
        # preload after libc, so a later read that shows it proves it was there. One that
        # is gone by then is not judged: an exiting process's maps are being torn down
        # (a read showed libc and its neighbours but not the preload, and then no
        # process, 2026-11-28).
        gone=0
        for again in 1 2 3; do
          [[ $maps == *"$lib"* ]] && break
          sleep 0.2
          m=$(cat "/proc/$p/maps" 2>/dev/null)
          if [[ -z $m ]]; then gone=1; break; fi
          maps=$m
          echo "pid $p: maps read again ($again)" >>"$work/preload-reread"
        done
        if ((gone)); then
          echo "pid $p: gone before a read showed the library: not judged" >>"$work/preload-reread"
        elif [[ $maps == *"$lib"* ]]; then seen=$((seen + 1)); else
          bad=$((bad + 1))
          # What it was, so that a failure explains itself in the log.
          { echo "pid $p: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)"
            grep -E '^(State|PPid|Uid):' "/proc/$p/status" 2>/dev/null
            echo "LD_PRELOAD in its environment: $(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep '^LD_PRELOAD=' || echo none)"
            echo "its mapped files:"; awk '$6 ~ /\// {print $6}' <<<"$maps" | uniq
          } >"$work/preload-bad.$p" 2>&1
        fi
        echo "$seen $bad" >"$work/preload-check"
      done
      sleep 1
    done
  ) &
  sampler=$!
fi

args=(--vardir="$work/var" --mysqld=--user=root --force --retry=0 --parallel=2
      --max-test-fail=0 --testcase-timeout=15 --suite-timeout=600 --skip-test-list="$skip")
if [[ $mode == quick ]]; then args+=("${quick[@]}"); else args+=(--suite="$suites"); fi
log=${out%.json}.log
t0=$SECONDS
echo "mariadb ($mode, ${lib##*/}): mtr ${args[*]}" | tee "$log"
(cd "$mtr_dir" && "${envp[@]}" perl mariadb-test-run.pl "${args[@]}") </dev/null >>"$log" 2>&1
rc=$?
secs=$((SECONDS - t0))
check="0 0"
[[ -f $work/preload-check ]] && check=$(cat "$work/preload-check")
[[ -f $work/preload-reread ]] && cat "$work/preload-reread" >>"$log"
for f in "$work"/preload-bad.*; do
  [[ -f $f ]] && { echo "== a mariadbd without the library"; cat "$f"; } | tee -a "$log"
done

/usr/bin/python3 - "$log" "$out" "$mode" "$lib" "$secs" "$rc" "$check" <<'PY'
import json, re, sys
log, out, mode, lib, secs, rc, check = sys.argv[1:8]
text = open(log, errors="replace").read()
status = {}
for m in re.finditer(r"^(?:worker\[\d+\] )?([\w-]+\.[\w.-]+(?: '[^']*')?)\s+(?:w\d+\s+)?\[ (pass|fail|skipped|disabled) \]", text, re.M):
    status.setdefault(m.group(1), m.group(2))  # first result of each test (no retries)
counts = {k: sum(1 for v in status.values() if v == k) for k in ("pass", "fail", "skipped", "disabled")}
failing = re.search(r"^Failing test\(s\): (.*)$", text, re.M)
completed = re.findall(r"^Completed: .*$", text, re.M)
seen, bad = (int(x) for x in check.split())
r = {"suite": "mariadb", "mode": mode, "allocator": "glibc" if lib == "glibc" else "keel",
     "library": lib, "seconds": int(secs), "exit_status": int(rc), "tests": len(status),
     "passed": counts["pass"], "failed": counts["fail"], "skipped": counts["skipped"],
     "disabled": counts["disabled"],
     "failed_tests": sorted(t for t, v in status.items() if v == "fail"),
     "failing_line": failing.group(1).split() if failing else [],
     "completed": completed[-1] if completed else "no 'Completed' line (mtr aborted?)",
     "servers_checked_preload": seen, "servers_without_preload": bad}
json.dump(r, open(out, "w"), indent=1)
print("mariadb %s under %s: %d tests: %d passed, %d failed %s, %d skipped; %s; %s s%s" % (
    mode, r["allocator"], r["tests"], r["passed"], r["failed"], r["failed_tests"][:20], r["skipped"],
    r["completed"], secs,
    "" if r["allocator"] == "glibc" else "; %d mariadbd processes seen, all mapping the library" % seen
    if bad == 0 else "; %d mariadbd processes WITHOUT the library" % bad))
if r["allocator"] == "keel" and (bad > 0 or seen == 0):
    sys.exit(3)
PY
prc=$?
((prc == 3)) && { echo "FAIL: mariadbd did not (provably) run with the preloaded library"; exit 1; }
grep -q '"failed": 0,' "$out" && grep -q '"tests": [1-9]' "$out" && exit 0
exit 1
