#!/usr/bin/env bash
# run_misuse.sh -- runs one misuse case and checks that Keel stopped it properly.
#
# Usage: run_misuse.sh <misuse-program> <case> <call> <words>
#   call:  the function named in the report ("free", "realloc"), or "fault" for an
#          access stopped by a guard page (KEEL_CHECK_GUARD), reported as
#          "keel: heap overflow: access at 0x... is ..."
#   words: text the report line must contain ("double free", "invalid pointer")
#
# Passes when:
#   1. the program died of SIGABRT (not another signal, not a normal exit);
#   2. its stderr has a line matching   keel: <call>\(\): .*0x[0-9a-f]+
#   3. that same line contains <words>.
# The address in the report is compared with the one the program announced before the
# misuse ("misuse: <case>: <call>(0x...)"); a difference is printed as a note only,
# except for faults, whose report must name the very address accessed.
#
# By hand:  bash tests/misuse/run_misuse.sh build/tests/test_misuse double_free_small free "double free"
# Environment: MISUSE_PREFIX (default "keel") -- the report prefix, so the checks can be
# exercised against another allocator's messages when validating this script.
set -u

if [[ $# -ne 4 ]]; then
  echo "usage: $0 <misuse-program> <case> <call> <words>" >&2
  exit 2
fi
prog=$1 case=$2 call=$3 words=$4
prefix=${MISUSE_PREFIX:-keel}

ulimit -c 0 2>/dev/null || true # an expected abort must not leave a core file behind
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT

# The group's 2>/dev/null silences bash's own "Aborted" job message, not the program's.
{ "$prog" "$case" >"$out" 2>"$err"; rc=$?; } 2>/dev/null

fail=0
say() { printf '%s\n' "$*"; }
dump() {
  say "---- stderr of '$prog $case' (exit status $rc) ----"
  cat "$err"
  if [[ -s $out ]]; then
    say "---- stdout ----"
    cat "$out"
  fi
  say "----"
}

# 1. killed by SIGABRT: bash reports 128 + signal number (SIGABRT = 6).
if [[ $rc -ne 134 ]]; then
  if [[ $rc -gt 128 ]]; then
    sig=$((rc - 128))
    say "FAIL: $case: killed by signal $sig ($(kill -l "$sig" 2>/dev/null || echo '?')), expected SIGABRT"
  elif grep -q "survived" "$err"; then
    say "FAIL: $case: the misuse was not detected (program exited with status $rc)"
  else
    say "FAIL: $case: exit status $rc, expected death by SIGABRT"
  fi
  fail=1
fi

# 2. the report line.
regex="${prefix}: ${call}\\(\\): .*0x[0-9a-f]+"
[[ $call == fault ]] && regex="${prefix}: [a-z ]+: access at 0x[0-9a-f]+"
line=$(grep -E -m1 "$regex" "$err" || true)
if [[ -z $line ]]; then
  say "FAIL: $case: no stderr line matches /$regex/"
  fail=1
else
  # 3. the words, on that same line.
  if [[ $line != *"$words"* ]]; then
    say "FAIL: $case: the report does not say '$words': $line"
    fail=1
  fi
  # Note only: does the report name the pointer the program passed?
  passed=$(sed -n -E "s/^misuse: [^:]+: ${call}\\((0x[0-9a-f]+)\\).*/\\1/p" "$err" | head -n1)
  reported=$(printf '%s\n' "$line" | grep -oE '0x[0-9a-f]+' | head -n1)
  if [[ -n $passed && -n $reported ]] && (( passed != reported )); then
    if [[ $call == fault ]]; then
      say "FAIL: $case: the report names $reported, the program accessed $passed"
      fail=1
    else
      say "note: $case: the report names $reported, the program passed $passed"
    fi
  elif [[ $call == fault && -z $passed ]]; then
    say "FAIL: $case: the program did not announce the address it accessed"
    fail=1
  fi
fi

if [[ $fail -ne 0 ]]; then
  dump
  exit 1
fi
say "ok: $case: $line"
exit 0
