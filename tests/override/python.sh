#!/usr/bin/env bash
# Override test: Debian's /usr/bin/python3 running an allocation-heavy, deterministic
# workload (py_workload.py: dicts/lists/strings/bignums churn, realloc growth, big
# blocks, sqlite3 and zlib, producer/consumer threads, fork while threads allocate,
# the malloc API through ctypes) under LD_PRELOAD=<libkeel.so>.
# Its output must equal the output of the same workload under glibc malloc.
#
# Usage: bash tests/override/python.sh /path/to/libkeel.so
OV_NAME=python
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"

PY=/usr/bin/python3 # not the pyenv shim first on PATH
ov_need_server "$PY"
ov_init "$@"

workload=$here/py_workload.py
export OV_SCALE=${OV_SCALE:-1}

# Reference: glibc malloc, no preload.
ov_log "reference run (glibc malloc)"
if ! ov_run -o "$OV_TMP/ref.out" -e "$OV_TMP/ref.err" \
     env -u LD_PRELOAD -u KEEL_STATS timeout 100 "$PY" "$workload"; then
  OV_LOGS+=("$OV_TMP/ref.out" "$OV_TMP/ref.err")
  ov_fail "the workload failed without the preload: the test itself is broken"
fi
grep -qx done "$OV_TMP/ref.out" || ov_fail "reference run did not finish"

# ov_py_run <tag> [env...]: the workload under the preload; checks maps, stats, output.
ov_py_run() {
  local tag=$1 st=0
  shift
  local o=$OV_TMP/$tag.out e=$OV_TMP/$tag.err m=$OV_TMP/$tag.maps
  ov_log "run '$tag' under the preload ($*)"
  ov_run -o "$o" -e "$e" env "$@" LD_PRELOAD="$OV_LIB" KEEL_STATS=1 OV_MAPS_OUT="$m" \
    timeout -k 5 100 "$PY" "$workload" || st=$?
  if ((st != 0)); then
    OV_LOGS+=("$o" "$e")
    ((st == 124)) && ov_fail "run '$tag' timed out (hang?)"
    ov_fail "run '$tag': python exited with status $st$(ov_status_hint "$st")"
  fi
  # (a) the process mapped the library (copied from /proc/self/maps while running).
  grep -qF "$OV_LIB" "$m" ||
    { OV_LOGS+=("$e"); ov_fail "run '$tag': /proc/self/maps of python does not contain $OV_LIB"; }
  ov_log "ok: /proc/<pid>/maps of python ('$tag') contains $OV_LIB"
  # (b) the exit statistics.
  OV_LOGS+=("$e")
  ov_check_stats "$e" "python ('$tag')"
  # The output must not depend on the allocator.
  if ! diff -u "$OV_TMP/ref.out" "$o" >"$OV_TMP/$tag.diff"; then
    cat "$OV_TMP/$tag.diff" >&2
    ov_fail "run '$tag': output differs from the glibc run"
  fi
  ov_log "ok: output of '$tag' equals the glibc run ($(wc -l <"$o") lines)"
}

# Every Python object allocation through malloc/free/realloc.
ov_py_run malloc PYTHONMALLOC=malloc
# Python's own small-object allocator on top: Keel sees the big blocks and C libraries.
ov_py_run pymalloc PYTHONMALLOC=pymalloc
