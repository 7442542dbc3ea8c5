#!/usr/bin/env bash
# Override test: what Keel adds to a process that barely allocates (`sleep`), the floor
# a process-per-connection server pays in every process (docs/design.md, "Per-process
# floor"). It checks the part the build lays out (src/hot_text.ld): an idle process runs
# only the code in libkeel's first 64 KiB of text, so the kernel's fault-around maps one
# window of it, not all of it. It also prints VmRSS / RssAnon under Keel and glibc.
#
# Usage: bash tests/override/idle_rss.sh /path/to/libkeel.so
OV_NAME=idle_rss
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"

ov_need_tool sleep
ov_init "$@"

# Rss (KiB) of the mappings of file $2 in process $1 whose permissions match $3.
rss_of() {
  awk -v f="$2" -v perm="$3" '
    /^[0-9a-f]+-[0-9a-f]+ / { on = (index($0, f) > 0 && $2 ~ perm) }
    on && $1 == "Rss:" { s += $2 }
    END { print s + 0 }' "/proc/$1/smaps"
}
# Rss (KiB) of the read-only mappings of file $2 in process $1 past its first segment
# that hold only file pages: the unwind tables (.eh_frame), which an idle process never
# reads (the relocated, read-only-after-start data holds anonymous pages and is left out).
unwind_rss_of() {
  awk -v f="$2" '
    /^[0-9a-f]+-[0-9a-f]+ / { if (on && rss > 0 && anon == 0) s += rss
                              on = (index($0, f) > 0 && $2 == "r--p" && $3 != "00000000")
                              rss = 0; anon = 0 }
    on && $1 == "Rss:" { rss = $2 }
    on && $1 == "Anonymous:" { anon = $2 }
    END { if (on && rss > 0 && anon == 0) s += rss; print s + 0 }' "/proc/$1/smaps"
}
status_kib() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }

# A process under the preload, looked at once its purger has published its statistics
# file (after its first second): everything an idle process ever runs has run by then.
R=() # run_idle's result: VmRSS, RssAnon, libkeel's resident code, all its file pages (KiB)
run_idle() { # run_idle <label> [env...]
  local label=$1 pid
  shift
  env "$@" sleep 30 &
  pid=$!
  OV_PIDS+=("$pid")
  OV_PID_WHAT[$pid]="sleep ($label)"
  if [[ "$label" == keel ]]; then
    local i
    for ((i = 0; i < 60; i++)); do
      [[ -e /dev/shm/keel-$pid ]] && break
      sleep 0.05
    done
    [[ -e /dev/shm/keel-$pid ]] || ov_fail "no /dev/shm/keel-$pid after 3 s: is the purger running?"
    ov_check_maps "$pid" "sleep"
  fi
  sleep 0.5
  R=("$(status_kib "$pid" VmRSS)" "$(status_kib "$pid" RssAnon)"
     "$(rss_of "$pid" "$OV_LIB" 'x')" "$(rss_of "$pid" "$OV_LIB" '.')"
     "$(unwind_rss_of "$pid" "$OV_LIB")")
  ov_stop "$pid" 5
  OV_PIDS=()
}

page_kib=$(($(getconf PAGESIZE) / 1024))
window_kib=$((page_kib > 64 ? page_kib : 64))

run_idle glibc -u LD_PRELOAD
g_rss=${R[0]} g_anon=${R[1]}
run_idle keel LD_PRELOAD="$OV_LIB"
k_rss=${R[0]} k_anon=${R[1]} k_text=${R[2]} k_file=${R[3]} k_unwind=${R[4]}
ov_log "sleep under glibc: VmRSS $g_rss KiB, RssAnon $g_anon KiB"
ov_log "sleep under Keel:  VmRSS $k_rss KiB, RssAnon $k_anon KiB; libkeel's file pages" \
  "$k_file KiB, of them code $k_text KiB"

((k_text > 0)) || ov_fail "no resident code of $OV_LIB in the process: did it load?"
((k_text <= window_kib)) ||
  ov_fail "libkeel's code resident in an idle process: $k_text KiB, more than one" \
    "$window_kib KiB fault-around window: code every process runs has left the first" \
    "window of .text (src/hot_text.ld), or .text outgrew it"
ov_log "ok: libkeel's resident code in an idle process is one window ($k_text <= $window_kib KiB)"
((k_unwind == 0)) ||
  ov_fail "libkeel's unwind tables resident in an idle process ($k_unwind KiB): start-up" \
    "read something in their segment - read-only data left the first segment (src/hot_text.ld)?"
ov_log "ok: libkeel's unwind tables are not resident in an idle process"

# The same for a process that has worked: threads churning a million small objects, every
# Python object through malloc (the
# fast paths' periodic slow paths, thread exit), a fork, its purger started and ticking.
PY=/usr/bin/python3
ov_need_tool "$PY"
PYTHONMALLOC=malloc LD_PRELOAD="$OV_LIB" "$PY" -c '
import os, threading, time
def work():
    d = {}
    for i in range(200000): d[i] = str(i) * 3
    for i in range(0, 200000, 2): del d[i]
ts = [threading.Thread(target=work) for _ in range(3)]
for t in ts: t.start()
for t in ts: t.join()
child = os.fork()  # the fork handlers
if child == 0:
    os._exit(0)
os.waitpid(child, 0)
print("ready", flush=True)
time.sleep(30)' >"$OV_TMP/busy.out" 2>&1 &
busy=$!
OV_PIDS+=("$busy")
OV_PID_WHAT[$busy]="python3 (busy)"
OV_LOGS+=("$OV_TMP/busy.out")
for ((i = 0; i < 300; i++)); do
  grep -q ready "$OV_TMP/busy.out" 2>/dev/null && break
  ov_running "$busy" || ov_fail "the busy python3 ended early"
  sleep 0.1
done
sleep 1.5 # a few purger ticks
ov_check_maps "$busy" "python3 (busy)"
b_text=$(rss_of "$busy" "$OV_LIB" 'x')
b_threads=$(ls "/proc/$busy/task" | wc -l)
ov_log "busy python3 under Keel: $b_threads threads, libkeel's resident code $b_text KiB"
((b_threads >= 2)) || ov_fail "the busy process has no purger thread"
((b_text <= window_kib)) ||
  ov_fail "libkeel's code resident in a process that worked: $b_text KiB, more than one" \
    "$window_kib KiB window: a path every busy process takes runs code outside .text"
ov_log "ok: and in a process that worked, with its purger running ($b_text <= $window_kib KiB)"
