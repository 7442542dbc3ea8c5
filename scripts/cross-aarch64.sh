#!/usr/bin/env bash
# Cross-builds Keel for arm64 (Debian's gcc-aarch64-linux-gnu, cmake/toolchain-aarch64.cmake),
# runs its test suites under qemu-user with 4, 16 and 64 KiB pages, and writes the
# page-size table results/pagesize.md (tests/pagesize/pagesize_results.py), with the
# x86-64 native figures beside it. Issue 8: arm64 kernels with 64 KiB pages have 512 MiB
# huge pages; Keel must not size anything by them.
#
# Usage: scripts/cross-aarch64.sh [--all | --page-size N ...] [options]
#   (no option)        the short run, for CI: suites once, with 64 KiB pages and
#                      KEEL_HUGE_PAGE_SIZE=512M, stress scaled down (KEEL_STRESS_SCALE=0.2);
#                      the table (all configurations: the probe takes a second each)
#   --all              the full run: suites with 4096, 16384, 65536, and 65536 +
#                      KEEL_HUGE_PAGE_SIZE=512M, stress at full scale; the table
#   --page-size N      suites with this page size (repeatable); add --huge 512M for
#                      KEEL_HUGE_PAGE_SIZE
#   --huge SIZE        KEEL_HUGE_PAGE_SIZE for the --page-size runs
#   --stress-scale S   KEEL_STRESS_SCALE for the suites (default 0.2 short, 1 --all)
#   --no-suites        only build and write the table
#   --build-dir DIR    cross build tree (default: build-aarch64)
#   --native-build DIR native build tree for the x86-64 row (default: $KEEL_BUILD_DIR or
#                      build); its pagesize_probe target is built if missing
#   --native-probe P   use this native probe, build nothing natively
#   --out FILE         the table (default: results/pagesize.md; JSON beside it)
#
# Suites: ctest -L "api|unit|stress|misuse|pagesize", one test at a time (the machine is
# shared), TIMEOUTs scaled for qemu (KEEL_QEMU_TIMEOUT_SCALE, tests/pagesize). Excluded:
#   unit.fastpath, unit.fastpath_medium
#                        valgrind (callgrind) counts x86-64 instructions; no arm64 valgrind
#                        under qemu
#   override.*           real x86-64 servers (not selected by the labels anyway)
#   stress.fork, stress.fork_profile  qemu-user 7.2 aborts ("qemu_plugin_vcpu_init_hook:
#                        assertion failed") when a child forked from a multi-threaded
#                        program starts a thread; tests/pagesize/qemu-issues/fork_thread.c
#                        shows it with glibc's malloc alone (--qemu-issues runs it)
#   stress.thread_churn  checks the RSS, which under qemu is qemu's: qemu leaks ~280 KiB per
#                        guest thread (qemu-issues/thread_rss.c, glibc alone), and
#                        /proc/self/statm counts host 4 KiB pages that the test multiplies by
#                        the guest's page size (16x too much with 64 KiB pages)
#   misuse_checked_guard.works  forks children that start Keel's purger thread: the same
#                        qemu-user abort as stress.fork
#   unit.thp             checks the VmFlags (hg/nh) that madvise(MADV_HUGEPAGE/NOHUGEPAGE)
#                        sets: qemu-user 7.2 treats those advices as hints and drops them
#                        (only MADV_DONTNEED reaches the host), so the flags never appear
#   pagesize.small_address_space  sets ulimit -v, which under qemu-user limits qemu's own
#                        address space (its 1 GiB translation buffer and the host view of
#                        the guest), not the program's
#   --qemu-issues      build and run those two reproducers (glibc only, no Keel) and exit
#
# Exit status: non-zero if the build, a suite or a target failed.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"

mode=short
pages=()
huge=""
scale=""
suites=1
qemu_issues=0
cross_build=$here/build-aarch64
native_build=${KEEL_BUILD_DIR:-$here/build}
native_probe=""
out=$here/results/pagesize.md
while [[ $# -gt 0 ]]; do
  case $1 in
    --all) mode=all; shift ;;
    --ci|--short) mode=short; shift ;;
    --page-size) mode=custom; pages+=("$2"); shift 2 ;;
    --huge) huge=$2; shift 2 ;;
    --stress-scale) scale=$2; shift 2 ;;
    --no-suites) suites=0; shift ;;
    --build-dir) cross_build=$(realpath -m "$2"); shift 2 ;;
    --native-build) native_build=$(realpath -m "$2"); shift 2 ;;
    --native-probe) native_probe=$(realpath -m "$2"); shift 2 ;;
    --out) out=$(realpath -m "$2"); shift 2 ;;
    --qemu-issues) qemu_issues=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "cross-aarch64: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done

log() { printf '== cross-aarch64: %s\n' "$*"; }
triplet=aarch64-linux-gnu
ld_prefix=/usr/$triplet
qemu=qemu-aarch64

if ! command -v $triplet-gcc >/dev/null || ! command -v $triplet-g++ >/dev/null ||
   ! command -v $qemu >/dev/null || [[ ! -e $ld_prefix/lib/ld-linux-aarch64.so.1 ]]; then
  log "cross toolchain or qemu-user missing: scripts/install-deps.sh --cross --no-servers"
  bash "$here/scripts/install-deps.sh" --cross --no-servers
fi

if ((qemu_issues)); then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  for prog in fork_thread thread_rss; do
    $triplet-gcc -O1 -pthread "$here/tests/pagesize/qemu-issues/$prog.c" -o "$tmp/$prog-arm64"
    gcc -O1 -pthread "$here/tests/pagesize/qemu-issues/$prog.c" -o "$tmp/$prog-native"
    log "$prog natively"
    "$tmp/$prog-native" | tail -n 1
    log "$prog under $qemu -L $ld_prefix"
    $qemu -L "$ld_prefix" "$tmp/$prog-arm64" 2>&1 | tail -n 4 || true
  done
  exit 0
fi

# ---- build ---------------------------------------------------------------------------
log "configuring $cross_build (toolchain cmake/toolchain-aarch64.cmake)"
cmake -S "$here" -B "$cross_build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$here/cmake/toolchain-aarch64.cmake" -DKEEL_BUILD_BENCH=OFF >/dev/null
log "building (2 jobs)"
cmake --build "$cross_build" -j2 | grep -vE '^\[[0-9]+/[0-9]+\] (Building|Linking)' || true
[[ -f "$cross_build/libkeel.so" ]] || { log "build failed"; exit 1; }
command -v file >/dev/null && file -L "$cross_build/libkeel.so" | sed "s/^/   /"
cross_probe=$cross_build/tests/pagesize/pagesize_probe

if [[ -z "$native_probe" ]]; then
  if [[ ! -f "$native_build/CMakeCache.txt" ]]; then
    log "configuring native tree $native_build"
    cmake -S "$here" -B "$native_build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  cmake --build "$native_build" -j2 --target pagesize_probe >/dev/null
  native_probe=$native_build/tests/pagesize/pagesize_probe
fi

# ---- suites under qemu -----------------------------------------------------------------
status=0
runs=()  # "pagesize:hugesize"
case $mode in
  short) runs=("65536:512M"); scale=${scale:-0.2} ;;
  all) runs=("4096:" "16384:" "65536:" "65536:512M"); scale=${scale:-1} ;;
  custom) for p in "${pages[@]}"; do runs+=("$p:$huge"); done; scale=${scale:-1} ;;
esac
labels="api|unit|stress|misuse|pagesize"
exclude='^(unit\.fastpath|unit\.fastpath_medium|stress\.fork|stress\.fork_profile|stress\.thread_churn|misuse_checked_guard\.works|unit\.thp|pagesize\.small_address_space)$'
summary=()
if ((suites)); then
  for run in "${runs[@]}"; do
    p=${run%%:*} h=${run#*:}
    what="QEMU_PAGESIZE=$p${h:+ KEEL_HUGE_PAGE_SIZE=$h} KEEL_STRESS_SCALE=$scale"
    log "suites under qemu: $what"
    t0=$SECONDS
    rc=0
    env QEMU_PAGESIZE="$p" KEEL_STRESS_SCALE="$scale" ${h:+KEEL_HUGE_PAGE_SIZE=$h} \
      ctest --test-dir "$cross_build" -L "$labels" -E "$exclude" -j1 --output-on-failure \
      >"$cross_build/ctest-$p${h:+-$h}.log" 2>&1 || rc=$?
    grep -E '^[0-9]+% tests passed|^\s+[0-9]+ - |Total Test time' "$cross_build/ctest-$p${h:+-$h}.log" |
      sed 's/^/   /' || true
    if ((rc != 0)); then
      status=1
      log "FAILED: $what (log: $cross_build/ctest-$p${h:+-$h}.log)"
      grep -B2 -A25 -E '\*\*\*Failed|\*\*\*Timeout|\(Failed\)|\(Timeout\)' \
        "$cross_build/ctest-$p${h:+-$h}.log" | head -n 80 || true
    fi
    summary+=("$what: $(grep -oE '[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+' \
      "$cross_build/ctest-$p${h:+-$h}.log" || echo 'no result') ($((SECONDS - t0)) s)")
  done
fi

# ---- the table -------------------------------------------------------------------------
log "page-size table -> $out"
rc=0
python3 "$here/tests/pagesize/pagesize_results.py" --native-probe "$native_probe" \
  --cross-probe "$cross_probe" --qemu "$qemu" --ld-prefix "$ld_prefix" \
  --out "$out" --json "${out%.md}.json" >/dev/null || rc=$?
sed -n '/^| configuration/,/^$/p; /^## Targets/,/^## What/p' "$out" | sed '/^## What/d'
((rc == 0)) || { status=1; log "FAILED: a page-size target was missed (see $out)"; }

for s in "${summary[@]}"; do log "$s"; done
# The closing line CI reads.
if ((status == 0)); then
  echo "cross-aarch64: ${#summary[@]} suite runs and the page-size targets: all passed"
else
  echo "cross-aarch64: FAILED (see above)"
fi
exit $status
