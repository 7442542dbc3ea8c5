#!/usr/bin/env bash
# run_overflow.sh -- the heap-overflow attack of overflow.c under Keel, with glibc's
# outcome beside it.
#
# Usage: run_overflow.sh <overflow-program> <libkeel.so> <case> <size>
#   case bin8|bin16|xthread: Keel must stop the program with SIGABRT and the line
#     "keel: malloc(): free list of the N-byte class corrupted at 0x..."; never return
#     the attacker's address or run on. glibc must stop it too (any signal); its last
#     line is printed for the record.
#   case key: the link secret is not zero, differs between two processes, and changes
#     when a process exec's itself.
set -u
prog=$1 lib=$2 case=$3 size=$4
# Under a cross build's emulator (tests/pagesize/emu-bash.sh) the library arrives as a
# launcher script, which no loader can preload: the attack is the same on every
# architecture and runs natively.
if [[ "$(head -c 4 "$lib" | od -An -c | tr -d ' ')" != '177ELF' ]]; then
  echo "skipped: $lib is not a loadable library here (a cross build's emulated run)"
  exit 77
fi
ulimit -c 0 2>/dev/null || true
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail=0

if [[ $case == key ]]; then
  a=$(LD_PRELOAD=$lib "$prog" key "$size") b=$(LD_PRELOAD=$lib "$prog" key "$size")
  mapfile -t e < <(LD_PRELOAD=$lib "$prog" key-exec "$size")
  echo "two processes: $a / $b; before and after exec: ${e[*]}"
  [[ $a == "key 0" || $a == "$b" ]] && { echo "FAIL: the secret is zero or the same in two processes"; fail=1; }
  [[ ${#e[@]} -ne 2 || ${e[0]} == "${e[1]}" ]] && { echo "FAIL: the secret did not change across exec"; fail=1; }
  exit $fail
fi

{ LD_PRELOAD=$lib "$prog" "$case" "$size" >"$out" 2>&1; rc=$?; } 2>/dev/null
echo "keel  (exit $rc): $(grep -m1 '^keel:' "$out" || tail -1 "$out")"
if ((rc != 134)); then echo "FAIL: Keel did not abort (exit $rc)"; fail=1; fi
if ! grep -Eq '^keel: malloc\(\): free list of the [0-9]+-byte class corrupted at 0x[0-9a-f]+' "$out"; then
  echo "FAIL: no report line naming the corrupted list"; cat "$out"; fail=1
fi
{ "$prog" "$case" "$size" >"$out" 2>&1; grc=$?; } 2>/dev/null
echo "glibc (exit $grc): $(tail -1 "$out")"
if ((grc < 128)); then echo "FAIL: glibc did not stop it either (the test no longer attacks)"; fail=1; fi
exit $fail
