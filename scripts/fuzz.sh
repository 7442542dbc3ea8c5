#!/usr/bin/env bash
# Builds and runs Keel's libFuzzer target (tests/fuzz/fuzz_keel.c) in its own tree:
# clang, KEEL_PREFIX=ON, library instrumented with -fsanitize=fuzzer-no-link,address,
# undefined (see tests/fuzz/CMakeLists.txt and the header of fuzz_keel.c).
#
# Usage: scripts/fuzz.sh [--regressions | --quick | --time SECONDS] [options] [-- libFuzzer args]
#   --regressions     run every input in tests/fuzz/corpus and tests/fuzz/regressions once
#   --quick           the regressions, then 60 s of fuzzing (CI; KEEL_FUZZ_QUICK_SECONDS)
#   --time S          the regressions, then S seconds of fuzzing (default 1200: make fuzz)
#   --jobs N          fuzzing processes side by side (default: 2 with --time, 1 with --quick)
#   --no-regressions  skip the regression inputs
#   --update-corpus   merge what the run found into tests/fuzz/corpus (minimised)
# Fuzzing starts from a scratch copy of tests/fuzz/corpus (the repo is not touched unless
# --update-corpus). A crash input is copied to tests/fuzz/regressions/ (then the ctest
# test fuzz.regressions replays it until the bug is fixed) and the script fails.
# --quick (CI) is one process on one core; make fuzz runs one per core of the 2-core
# machine (-jobs), each for the whole time, and adds up their operations.
# Environment: KEEL_FUZZ_BUILD (build dir, default ./build-fuzz), CLANG (default clang),
# KEEL_FUZZ_RESULTS (logs and artifacts, default ./results/fuzz).
# Exit status: 0 ok, 1 crash or failure, 77 clang/libFuzzer not installed.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${KEEL_FUZZ_BUILD:-$here/build-fuzz}
results=${KEEL_FUZZ_RESULTS:-$here/results/fuzz}
cc=${CLANG:-clang}
mode=time
secs=1200
jobs=
regress=1
update=0
extra=()
while (($#)); do
  case $1 in
    --regressions) mode=regressions ;;
    --quick) mode=time; secs=${KEEL_FUZZ_QUICK_SECONDS:-60}; jobs=${jobs:-1} ;;
    --time) mode=time; secs=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    --no-regressions) regress=0 ;;
    --update-corpus) update=1 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--regressions|--quick|--time S] [--no-regressions] [--update-corpus] [-- args]" >&2; exit 2 ;;
  esac
  shift
done

log() { printf '[fuzz %s] %s\n' "$(date +%T)" "$*"; }

command -v "$cc" >/dev/null || { log "SKIP: $cc not installed (scripts/install-deps.sh)"; exit 77; }
rt=$("$cc" -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null)
if [[ "$(uname -m)" == x86_64 && ! -f "$rt" ]]; then
  log "SKIP: libFuzzer runtime not found (Debian: libclang-rt-14-dev)"
  exit 77
fi

mkdir -p "$build" "$results"
cxx=${CLANGXX:-${cc/clang/clang++}}
if [[ ! -f "$build/build.ninja" ]]; then
  log "configuring $build"
  CC=$cc CXX=$cxx cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DKEEL_PREFIX=ON -DKEEL_FUZZ=ON -DKEEL_DEBUG=1 -DKEEL_BUILD_BENCH=OFF \
    -DKEEL_SANITIZE=fuzzer-no-link,address,undefined \
    -DCMAKE_C_FLAGS=-fno-sanitize-recover=undefined \
    -DCMAKE_CXX_FLAGS=-fno-sanitize-recover=undefined >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log"; exit 1; }
fi
cmake --build "$build" -j2 --target fuzz_keel >"$build/build.log" 2>&1 ||
  { tail -40 "$build/build.log"; exit 1; }
bin=$build/tests/fuzz/fuzz_keel
[[ -x $bin ]] || { log "no fuzzer binary at $bin"; exit 1; }

# ASan: Keel's blocks are its own mmap'ed memory; ASan watches Keel's globals and
# stacks and the harness. The harness frees everything per input, so leaks are real.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
opts=(-rss_limit_mb=4096 -malloc_limit_mb=4096 -max_len=4096 -timeout=60 -print_final_stats=1)
status=0

if ((regress)); then
  inputs=()
  for f in "$here"/tests/fuzz/regressions/* "$here"/tests/fuzz/corpus/*; do
    [[ -f $f ]] && inputs+=("$f")
  done
  log "replaying ${#inputs[@]} inputs (tests/fuzz/corpus, tests/fuzz/regressions)"
  if ((${#inputs[@]})); then
    if "$bin" "${opts[@]}" "${inputs[@]}" >"$results/regressions.log" 2>&1; then
      log "regressions: ${#inputs[@]} inputs ok"
    else
      tail -40 "$results/regressions.log"
      log "regressions: FAILED (log: $results/regressions.log)"
      status=1
    fi
  fi
fi

if [[ $mode == time ]] && ((status == 0)); then
  work=$(mktemp -d "${TMPDIR:-/tmp}/keel-fuzz-corpus.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  cp "$here"/tests/fuzz/corpus/* "$work"/ 2>/dev/null || true
  art="$results/artifacts/"
  mkdir -p "$art"
  log "fuzzing for $secs s (corpus: $(ls "$work" | wc -l) seeds; log: $results/fuzz.log)"
  jobs=${jobs:-2}
  if ((jobs > 1)); then
    # Each worker logs to fuzz-<n>.log in the current folder; they share the corpus.
    rm -f "$results"/fuzz-*.log
    (cd "$results" && "$bin" "${opts[@]}" -max_total_time="$secs" -artifact_prefix="$art" \
      -jobs="$jobs" -workers="$jobs" -seed="${KEEL_FUZZ_SEED:-0}" "${extra[@]}" "$work") >"$results/fuzz.log" 2>&1
    rc=$?
    stats=("$results"/fuzz-*.log)
  else
    "$bin" "${opts[@]}" -max_total_time="$secs" -artifact_prefix="$art" \
      -seed="${KEEL_FUZZ_SEED:-0}" "${extra[@]}" "$work" >"$results/fuzz.log" 2>&1
    rc=$?
    stats=("$results/fuzz.log")
  fi
  execs=$(cat "${stats[@]}" | grep -o 'stat::number_of_executed_units: *[0-9]*' | grep -o '[0-9]*$' |
    awk '{s += $1} END {print s}')
  ops=$(cat "${stats[@]}" | grep -o 'fuzz_keel: [0-9]* allocator operations' | grep -o '[0-9][0-9]*' |
    awk '{s += $1} END {print s}')
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$results/fuzz.log" | tail -1)
  log "done: status $rc, $jobs process(es), ${execs:-?} executions, ${ops:-?} allocator operations" \
    "($(( ${ops:-0} / secs )) per second), ${cov:-?}, corpus now $(ls "$work" | wc -l)"
  if ((rc != 0)); then
    status=1
    grep -E 'fuzz_keel: FAILED|ERROR: |runtime error|SUMMARY' "$results/fuzz.log" | head -10
    for c in "$art"crash-* "$art"timeout-* "$art"oom-* "$art"leak-*; do
      [[ -f $c ]] || continue
      cp "$c" "$here/tests/fuzz/regressions/$(basename "$c")"
      log "kept $(basename "$c") in tests/fuzz/regressions/ (replayed by ctest -L fuzz)"
    done
  fi
  if ((update)); then
    mkdir -p "$work.min"
    "$bin" -merge=1 "${opts[@]}" "$work.min" "$here/tests/fuzz/corpus" "$work" >"$results/merge.log" 2>&1 &&
      cp -n "$work.min"/* "$here/tests/fuzz/corpus/" 2>/dev/null
    log "corpus: $(ls "$here/tests/fuzz/corpus" | wc -l) files"
    rm -rf "$work.min"
  fi
fi
exit $status
