#!/usr/bin/env bash
# Real programs' own test suites under Keel, next to the same run under glibc:
# CPython's regression tests (tests/suites/python.sh) and MariaDB's mysql-test-run
# (tests/suites/mariadb.sh).
#
# Usage: scripts/suites.sh [--quick|--full] [--alloc keel|glibc|both] [--only python|mariadb]
#                          [--lib PATH] [--results DIR]
#   --quick   the fixed short lists (each suite ~2-4 min per allocator; ctest -L suites
#             runs them under Keel only)
#   --full    (default) CPython: every test module; MariaDB: suites main,json
#             (KEEL_SUITES_MTR_SUITES=main,innodb,json for more). Allow 1-2 hours.
#   --alloc   default both: glibc first, then Keel, one after the other (never at once)
#   --lib     libkeel.so to preload (default build/libkeel.so)
#   --results where the JSON, logs and summary go (default results/suites)
# Writes <results>/<mode>-<suite>-<alloc>.{json,log}, and with both allocators
# <results>/<mode>-summary.md and <mode>-summary.json: counts side by side and every test
# that fails under one allocator only. Exit status: non-zero if a test fails under Keel
# that passes under glibc (with --alloc keel: if any test fails).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/scripts/lib/runner.sh"
mode=full alloc=both only="python mariadb" lib=$here/build/libkeel.so results=$here/results/suites
USAGE="[--quick|--full] [--alloc keel|glibc|both] [--only python|mariadb] [--lib PATH] [--results DIR]"
runner_own_option() {
  RUNNER_TOOK=1
  case $1 in
    --quick) mode=quick ;;
    --full) mode=full ;;
    *) return 1 ;;
  esac
}
runner_parse "$@"
[[ " ${allocs[*]} " == *" keel "* && ! -f $lib ]] && { echo "no $lib: build first (scripts/build.sh)"; exit 1; }

status=0 skipped=0 ran=0
for s in $only; do
  for a in "${allocs[@]}"; do
    what=$a
    [[ $a == keel ]] && what=$lib
    echo "== $s ($mode) under $a"
    bash "$here/tests/suites/$s.sh" "$mode" "$what" "$results/$mode-$s-$a.json"
    rc=$?
    if ((rc == 77)); then skipped=$((skipped + 1)); continue; fi
    ran=$((ran + 1))
    # With one allocator, any failure fails; with both, the comparison below decides,
    # but a run that did not happen (no results, or Keel not provably loaded) fails.
    [[ $alloc != both ]] && ((rc != 0)) && status=1
    if ! /usr/bin/python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r.get("tests", r.get("cases", {}).get("tests", 0)) > 0 else 1)' \
         "$results/$mode-$s-$a.json" 2>/dev/null; then
      echo "== $s under $a: no test ran (see $results/$mode-$s-$a.log)"; status=1
    fi
  done
done

if [[ $alloc == both ]]; then
  /usr/bin/python3 - "$results" "$mode" $only <<'PY' || status=1
import json, os, sys
results, mode, suites = sys.argv[1], sys.argv[2], sys.argv[3:]
rows, diff, bad = [], {}, False
def load(s, a):
    p = os.path.join(results, "%s-%s-%s.json" % (mode, s, a))
    return json.load(open(p)) if os.path.exists(p) else None
for s in suites:
    g, k = load(s, "glibc"), load(s, "keel")
    if not g or not k:
        continue
    if s == "python":
        fg, fk = set(g["modules_failed"]), set(k["modules_failed"])
        cg, ck = set(g["cases_failed"]), set(k["cases_failed"])
        for r, a in ((g, "glibc"), (k, "keel")):
            c = r["cases"]
            rows.append("| CPython regrtest (%s) | %s | %d ok, %d failed, %d skipped | %d run, %d failures+errors, %d skipped | %d s |" % (
                mode, a, r["modules_ok"], len(r["modules_failed"]), r["modules_skipped"],
                c["tests"], c["failures"] + c["errors"], c["skipped"], r["seconds"]))
        diff[s] = {"failed_under_keel_only": sorted(fk - fg), "failed_under_glibc_only": sorted(fg - fk),
                   "cases_failed_under_keel_only": sorted(ck - cg), "cases_failed_under_glibc_only": sorted(cg - ck)}
    else:
        fg, fk = set(g["failed_tests"]), set(k["failed_tests"])
        for r, a in ((g, "glibc"), (k, "keel")):
            rows.append("| MariaDB mtr (%s) | %s | %d tests: %d passed, %d failed, %d skipped | | %d s |" % (
                mode, a, r["tests"], r["passed"], r["failed"], r["skipped"], r["seconds"]))
        diff[s] = {"failed_under_keel_only": sorted(fk - fg), "failed_under_glibc_only": sorted(fg - fk)}
    if diff[s]["failed_under_keel_only"]:
        bad = True
md = ["# Test suites: Keel next to glibc (%s)" % mode, "",
      "| suite | allocator | modules / tests | test cases | time |", "|---|---|---|---|---|"] + rows + [""]
for s, d in diff.items():
    for k, v in d.items():
        md.append("- %s, %s: %s" % (s, k.replace("_", " "), ", ".join(v) if v else "none"))
open(os.path.join(results, "%s-summary.md" % mode), "w").write("\n".join(md) + "\n")
json.dump(diff, open(os.path.join(results, "%s-summary.json" % mode), "w"), indent=1)
print("\n".join(md))
sys.exit(1 if bad else 0)
PY
fi
((ran == 0 && skipped > 0)) && exit 77
exit $status
