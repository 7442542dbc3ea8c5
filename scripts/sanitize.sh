#!/usr/bin/env bash
# Keel's own tests under sanitizers and the expensive debug build. Each flavour gets its
# own build tree (never ./build) and runs in a few minutes on a 2-core machine:
#
#   ubsan   -DKEEL_SANITIZE=undefined, -fno-sanitize-recover=all (any report fails):
#           ctest -L 'api|unit|stress|misuse|faults' (not unit.fastpath and
#           unit.fastpath_medium, whose instruction counts are meaningless here), stress scaled down.
#   tsan    -DKEEL_PREFIX=ON -DKEEL_SANITIZE=thread: tests/sanitize/test_tsan.c, threads
#           calling keel_malloc/keel_free/... directly (TSan owns malloc), with
#           TSAN_OPTIONS=halt_on_error=1: any data race fails.
#   debug2  -DKEEL_DEBUG=2 (assertions, plus the invariant walk _keel_verify() every 4096
#           slow-path calls): ctest -L 'stress|unit|faults', stress scaled down.
#
# Usage: scripts/sanitize.sh [ubsan] [tsan] [debug2]     (no argument: all three, in turn)
# Environment:
#   KEEL_SANITIZE_ROOT   where the build trees go (default: the repo; build-ubsan, ...)
#   KEEL_STRESS_SCALE    stress scale (defaults: ubsan 0.5, tsan 1, debug2 1; each flavour
#                        then takes 30-90 s on 2 cores, plus its build)
#   CC / CXX             compiler (default: cmake's choice, gcc on Debian)
# Exit status: non-zero if any flavour failed. One summary line per flavour at the end.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
root=${KEEL_SANITIZE_ROOT:-$here}
flavours=("$@")
((${#flavours[@]})) || flavours=(ubsan tsan debug2)

summary=()
status=0

log() { printf '[sanitize %s] %s\n' "$(date +%T)" "$*"; }

configure_build() { # <dir> <cmake args...>
  local dir=$1
  mkdir -p "$dir"
  shift
  cmake -S "$here" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DKEEL_BUILD_BENCH=OFF "$@" >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; return 1; }
}

# build_flavour <name> <dir> <cmake args...> [-- <cmake --build args...>]: configures and
# builds; on failure shows the end of the build log, records "<name>: build FAILED" and
# returns 1.
build_flavour() {
  local name=$1 dir=$2 conf=()
  shift 2
  while (($#)) && [[ $1 != -- ]]; do conf+=("$1"); shift; done
  (($#)) && shift
  configure_build "$dir" "${conf[@]}" &&
    cmake --build "$dir" -j2 "$@" >"$dir.build.log" 2>&1 && return 0
  tail -40 "$dir.build.log" 2>/dev/null
  summary+=("$name: build FAILED"); status=1
  return 1
}

run_flavour() { # <name> <build dir> <ctest args...>
  local name=$1 dir=$2
  shift 2
  local t0=$SECONDS out rc
  out=$(mktemp)
  ctest --test-dir "$dir" --output-on-failure --timeout 900 "$@" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  local line
  line=$(grep -E '^[0-9]+% tests passed' "$out" | tail -1)
  # A sanitizer report anywhere in the output fails the flavour even if a test's
  # exit status hid it (e.g. a report from a forked child that exited 0).
  if grep -qE '(runtime error:|WARNING: ThreadSanitizer|ERROR: ThreadSanitizer|ERROR: AddressSanitizer)' "$out"; then
    log "$name: sanitizer report in the output"
    rc=1
  fi
  rm -f "$out"
  summary+=("$name: ${line:-no tests ran} ($((SECONDS - t0)) s)$( ((rc)) && echo ' FAILED')")
  ((rc == 0)) || status=1
}

for f in "${flavours[@]}"; do
  case $f in
    ubsan)
      dir=$root/build-ubsan
      log "ubsan: configuring and building $dir"
      flags="-fno-sanitize-recover=all"
      if build_flavour ubsan "$dir" -DKEEL_SANITIZE=undefined -DKEEL_DEBUG=1 \
           -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags"; then
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:abort_on_error=0 \
        KEEL_STRESS_SCALE=${KEEL_STRESS_SCALE:-0.5} \
          run_flavour ubsan "$dir" -L 'api|unit|stress|misuse|faults' -E 'unit\.fastpath'
      fi
      ;;
    tsan)
      dir=$root/build-tsan
      log "tsan: configuring and building $dir (KEEL_PREFIX=ON)"
      if build_flavour tsan "$dir" -DKEEL_PREFIX=ON -DKEEL_SANITIZE=thread -DKEEL_DEBUG=1 \
           -- --target test_tsan; then
        KEEL_STRESS_SCALE=${KEEL_STRESS_SCALE:-1} run_flavour tsan "$dir" -L tsan
      fi
      ;;
    debug2)
      dir=$root/build-debug2
      log "debug2: configuring and building $dir (KEEL_DEBUG=2)"
      if build_flavour debug2 "$dir" -DKEEL_DEBUG=2; then
        KEEL_STRESS_SCALE=${KEEL_STRESS_SCALE:-1} \
          run_flavour debug2 "$dir" -L 'stress|unit|faults' -E 'unit\.fastpath'
      fi
      ;;
    *)
      echo "usage: $0 [ubsan] [tsan] [debug2]" >&2
      exit 2
      ;;
  esac
done

echo "== sanitize summary"
for s in "${summary[@]}"; do echo "  $s"; done
exit $status
