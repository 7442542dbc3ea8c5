#!/usr/bin/env bash
# run_options.sh -- runs test_options in its three modes and checks what Keel said.
#
# Usage: run_options.sh <test_options-program>
# keel_conf (defined by the program) has two bad entries: an unknown option and a bad
# THP policy; each must give exactly one warning line and leave the default. In the
# environment, a bad KEEL_PROFILE_RATE must do the same, and so must a KEEL_PROFILE_PREFIX
# too long to keep whole (not cut to another path).
set -u
prog=${1:?usage: $0 <test_options>}
err=$(mktemp)
trap 'rm -f "$err"' EXIT
fail=0

expect_lines() { # <what> <count> <regex>
  local n
  n=$(grep -cE "$3" "$err")
  if [[ $n != "$2" ]]; then
    echo "FAIL: $1: $n lines match /$3/ on stderr, want $2"
    sed 's/^/  stderr: /' "$err"
    fail=1
  fi
}

run() { # <mode> [VAR=value...]
  local mode=$1
  shift
  if ! env -u KEEL_PURGE_DELAY -u KEEL_THP -u KEEL_TCACHE_MAX -u KEEL_PROFILE_RATE -u KEEL_PROFILE_PREFIX "$@" \
       "$prog" "$mode" 2>"$err"; then
    echo "FAIL: test_options $mode"
    sed 's/^/  stderr: /' "$err"
    fail=1
  fi
}

run conf
expect_lines "conf: unknown name" 1 '^keel: .*keel_conf: ignoring an unknown option .*bogus$'
expect_lines "conf: bad thp" 1 '^keel: .*ignoring bad value \(want system, always, never or dense\) of keel_conf option thp$'
expect_lines "conf: nothing else" 2 '^keel:'

long_prefix=/tmp/$(printf 'p%.0s' {1..245})
run env KEEL_PURGE_DELAY=300 KEEL_THP=never KEEL_PROFILE_RATE=lots KEEL_PROFILE_PREFIX="$long_prefix"
expect_lines "env: bad KEEL_PROFILE_RATE" 1 '^keel: .*ignoring bad value \(want a size like 512K, 4M\) of KEEL_PROFILE_RATE$'
expect_lines "env: long KEEL_PROFILE_PREFIX" 1 '^keel: .*ignoring a value longer than 199 bytes of KEEL_PROFILE_PREFIX$'
expect_lines "env: nothing else" 4 '^keel:'

# The api run publishes its statistics file, and before that sweeps the files nobody
# serves: one for a process that has just ended must go, and one for a live process that
# does not map it (this shell: as a process that exec'd a program without Keel) once it
# is a minute old; one a live process made a moment ago may not be mapped yet, and stays.
true &
dead=$!
wait $dead
sleep 60 &
sleeper=$!
stale=/dev/shm/keel-$dead unmapped=/dev/shm/keel-$$ fresh=/dev/shm/keel-$sleeper
: >"$stale"
: >"$unmapped"
touch -d '-1 minute' "$unmapped"
: >"$fresh"
trap 'rm -f "$err" "$stale" "$unmapped" "$fresh"; kill $sleeper 2>/dev/null' EXIT
run api
expect_lines "api: warnings only from keel_conf" 2 '^keel:'
if [[ -e $stale ]]; then echo "FAIL: $stale (an ended process's file) was not swept"; fail=1; fi
if [[ -e $unmapped ]]; then echo "FAIL: $unmapped (a live process's file it does not map) was not swept"; fail=1; fi
if [[ ! -e $fresh ]]; then echo "FAIL: $fresh (a file just made) was swept"; fail=1; fi

((fail == 0)) && echo "run_options: all modes passed"
exit $fail
