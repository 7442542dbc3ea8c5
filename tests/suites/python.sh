#!/usr/bin/env bash
# CPython's own regression tests (Debian's libpython3.11-testsuite) with a given malloc.
#
# Usage: bash tests/suites/python.sh <quick|full> <libkeel.so|glibc> <result.json>
#   quick  a fixed list of multi-threaded and allocation-heavy test modules (~3 min)
#   full   every test module (python3 -m test), no extra resources (-u), same exclusions
#          for every allocator
# The interpreter runs with PYTHONMALLOC=malloc, so every Python object goes through
# malloc (not pymalloc's arenas): the allocator under test sees all of CPython's
# allocations. Workers (-j2) are subprocesses and inherit LD_PRELOAD. Before the run, a
# probe proves the preload took (the library is mapped and its malloc is the one in use).
# Writes <result.json>: modules ok/failed/skipped..., test cases (JUnit XML), seconds.
# Exit status: 0 if no module failed, 1 otherwise, 77 if the test suite is not installed.
set -uo pipefail
mode=${1:?quick|full} lib=${2:?libkeel.so or glibc} out=${3:?result.json}
py=/usr/bin/python3
testdir=$($py -c 'import sysconfig,os;print(os.path.join(sysconfig.get_paths()["stdlib"],"test"))')
if [[ ! -f $testdir/regrtest.py || ! -d $testdir/test_asyncio ]]; then
  echo "SKIP: CPython's test suite is not installed (apt-get install libpython3.11-testsuite)"
  exit 77
fi

quick=(test_threading test_thread test_threading_local test_queue test_asyncio test_json
       test_re test_dict test_list test_set test_bytes test_unicode test_gc test_weakref
       test_pickle test_struct test_array test_hashlib test_zlib test_bz2 test_lzma
       test_decimal test_xml_etree_c test_mmap test_tracemalloc test_io test_memoryview
       test_deque test_heapq test_sort)
# Never in a run (both allocators alike): need a display, take most of an hour, or (for
# test_socket) hang here under glibc too, for 20 minutes until the timeout.
exclude=(test_tkinter test_ttk test_ttk_textonly test_idle test_turtle test_tix test_peg_generator
         test_socket)

work=$(mktemp -d "${TMPDIR:-/tmp}/keel-suites-python.XXXXXX")
trap 'rm -rf "$work"' EXIT
env_pre=(env PYTHONMALLOC=malloc PYTHONDONTWRITEBYTECODE=1 TMPDIR="$work")
if [[ $lib != glibc ]]; then
  lib=$(readlink -f "$lib")
  [[ -f $lib ]] || { echo "no such library: $lib"; exit 1; }
  env_pre+=(LD_PRELOAD="$lib")
  # Probe: the library is mapped, and a malloc'ed block is Keel's (keel_stats moves).
  "${env_pre[@]}" $py - "$lib" <<'PY' || { echo "FAIL: the preload did not take"; exit 1; }
import ctypes, sys
lib = sys.argv[1]
assert lib in open("/proc/self/maps").read(), "not mapped"
k = ctypes.CDLL(lib)
class S(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("size", ctypes.c_uint32), ("allocated", ctypes.c_uint64)] + \
               [("f%d" % i, ctypes.c_uint64) for i in range(20)]
def alloc():
    s = S(); s.size = ctypes.sizeof(S); assert k.keel_stats_get(ctypes.byref(s)) == 0; return s.allocated
a0 = alloc(); big = bytearray(64 << 20); a1 = alloc()
assert a1 >= a0 + (64 << 20), "malloc is not keel's (%d -> %d)" % (a0, a1)
print("probe: %s mapped, bytearray(64 MiB) raised keel allocated by %d MiB" % (lib, (a1 - a0) >> 20))
PY
fi

args=(-m test -j2 --timeout 1200 --junit-xml "$work/junit.xml")
for x in "${exclude[@]}"; do args+=(-x "$x"); done
if [[ $mode == quick ]]; then
  # -x turns the arguments into exclusions: select by listing instead.
  # A hung module is stopped after 5 minutes (the quick run must stay under ctest's limit).
  args=(-m test -j2 --timeout 300 --junit-xml "$work/junit.xml" "${quick[@]}")
fi
log=${out%.json}.log
xml=${out%.json}.junit.xml
t0=$SECONDS
echo "python ($mode, ${lib##*/}): ${env_pre[*]:1} $py ${args[*]}" | tee "$log"
# SIGINT back to its default first: a shell that starts this in the background ignores
# it, children inherit that, and then CPython's own InterruptMainTests (interrupt_main
# raises KeyboardInterrupt only when SIGINT is handled) fail under any allocator.
launch='import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); sys.argv[0] = "python -m test"; runpy.run_module("test", run_name="__main__", alter_sys=True)'
(cd "$work" && "${env_pre[@]}" $py -c "$launch" "${args[@]:2}") </dev/null >>"$log" 2>&1
rc=$?
secs=$((SECONDS - t0))
cp "$work/junit.xml" "$xml" 2>/dev/null || rm -f "$xml"

$py - "$log" "$xml" "$out" "$mode" "$lib" "$secs" "$rc" <<'PY'
import json, re, sys, xml.etree.ElementTree as ET
log, junit, out, mode, lib, secs, rc = sys.argv[1:8]
text = open(log, errors="replace").read()
# The summary lists module names after lines like "3 tests failed:", "12 tests skipped:".
res = {}
for m in re.finditer(r"^(\d+) tests? ([a-z ()]+?):\n((?:    .*\n)+)", text, re.M):
    res[m.group(2)] = sorted(m.group(3).split())
ok = re.search(r"^(?:All )?(\d+) tests? OK\.", text, re.M)
cases = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
failed_cases = []
try:
    root = ET.parse(junit).getroot()
    for tc in root.iter("testcase"):
        cases["tests"] += 1
        if tc.find("failure") is not None:
            cases["failures"] += 1
        if tc.find("error") is not None:
            cases["errors"] += 1
        if tc.find("skipped") is not None:
            cases["skipped"] += 1
        if tc.find("failure") is not None or tc.find("error") is not None:
            failed_cases.append("%s.%s" % (tc.get("classname", ""), tc.get("name", "")))
except Exception as e:  # a crashed run may leave no XML
    cases["note"] = "no junit xml: %s" % e
r = {
    "suite": "python", "mode": mode, "allocator": "glibc" if lib == "glibc" else "keel",
    "library": lib, "seconds": int(secs), "exit_status": int(rc),
    "modules_ok": int(ok.group(1)) if ok else 0,
    "modules_failed": res.get("failed", []),
    "modules_env_changed": res.get("altered the execution environment", []) + res.get("env changed", []),
    "modules_skipped": len(res.get("skipped", [])) + len(res.get("skipped (resource denied)", [])),
    "modules_run_no_tests": res.get("run no tests", []),
    "result_line": (re.findall(r"^Result: .*|^== Tests result: .*", text, re.M) or ["?"])[-1],
    "cases": cases, "cases_failed": sorted(failed_cases)[:500],
}
json.dump(r, open(out, "w"), indent=1)
print("python %s under %s: %d modules ok, %d failed %s, %d skipped; test cases: %d run, %d failures, "
      "%d errors, %d skipped; %s s" % (mode, r["allocator"], r["modules_ok"], len(r["modules_failed"]),
      r["modules_failed"], r["modules_skipped"], cases["tests"], cases["failures"], cases["errors"],
      cases["skipped"], secs))
PY
[[ $rc -eq 0 ]] && exit 0
grep -q '"modules_failed": \[\]' "$out" && exit 0
exit 1
