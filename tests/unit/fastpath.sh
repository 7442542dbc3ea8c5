#!/usr/bin/env bash
# Guards the fast path's cost: instructions per malloc(SIZE)+free pair (32 bytes, or
# --size N), counted by callgrind (deterministic), must stay within a small margin of the
# golden number.
# Usage: fastpath.sh LOOP_BINARY LIBKEEL GOLDEN_FILE [--size N] [--update]
set -euo pipefail
loop=$1 lib=$2 golden=$3
shift 3
size=32 update=
while (( $# )); do
  case $1 in
    --size) size=$2; shift 2 ;;
    --update) update=1; shift ;;
    *) echo "fastpath.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v valgrind >/dev/null || { echo "valgrind not installed"; exit 77; }
# The purger thread's ticks, and its creating the published-statistics file once the
# run has lived a second, count too, as many as the run's wall time allows: off, so the
# count is the loop's alone (under load it varied by up to 4 a pair).
count() { # instructions of one run with N iterations
  KEEL_BACKGROUND_PURGE=0 KEEL_PUBLISH=0 LD_PRELOAD=$lib valgrind --tool=callgrind --callgrind-out-file=/dev/null "$loop" "$1" "$size" 2>&1 |
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
a=$(count 200000); b=$(count 1200000)
per=$(( (b - a) / 1000000 ))
per_x100=$(( (b - a) / 10000 ))
echo "instructions per malloc($size)+free pair (loop included): $per_x100 / 100"
if [[ -n "$update" ]]; then echo "$per" > "$golden"; echo "golden updated"; exit 0; fi
want=$(tr -dc 0-9 < "$golden")
# One instruction of margin: compilers differ a little; a real regression is more.
if (( per > want + 1 )); then
  echo "FAIL: fast path grew from $want to $per instructions per pair"
  echo "0 passed, 1 failed"; exit 1
fi
echo "fast path within golden ($want)"
echo "1 passed, 0 failed"
