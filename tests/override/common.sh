# common.sh -- helpers sourced by Keel's override tests (tests/override/*.sh).
#
# Each test runs a real program with LD_PRELOAD=<libkeel.so> and checks both its
# output and that Keel really was the allocator in that process:
#   (a) /proc/<pid>/maps of the running process names the preloaded library;
#   (b) with KEEL_STATS=1 the process writes a block starting with a line
#       "keel: statistics..." to its stderr when it exits.
#
# Environment knobs (all optional):
#   KEEL_OVERRIDE_EXPECT_STATS=0  don't require (b); only for validating the scripts
#                                 with another allocator (e.g. Debian's jemalloc).
#   KEEL_OVERRIDE_KEEP=1          keep the throw-away directory (for post-mortems).
#   KEEL_OVERRIDE_STOP_TIMEOUT=N  seconds to wait after SIGTERM before SIGKILL (30).
#
# Exit codes: 0 pass, 1 fail, 77 skip (program not installed).

set -euo pipefail

OV_SKIP=77
OV_NAME=${OV_NAME:-override}
OV_TMP=""
OV_LIB=""
OV_PIDS=()          # processes to stop at exit (servers), in start order
declare -A OV_PID_WHAT=() # pid -> label
declare -A OV_PID_LOGS=() # pid -> log files to show on failure
OV_LOGS=()          # extra log files to show on failure
OV_T0=$SECONDS

ov_log()  { printf '[%s %3ds] %s\n' "$OV_NAME" $((SECONDS - OV_T0)) "$*"; }
ov_fail() { printf '[%s %3ds] FAIL: %s\n' "$OV_NAME" $((SECONDS - OV_T0)) "$*" >&2; exit 1; }
ov_skip() { printf '[%s] SKIP: %s\n' "$OV_NAME" "$*"; exit "$OV_SKIP"; }

# ov_need_server <binary...>: skip the test when the server program is not installed.
ov_need_server() { ov_need ov_skip "$@"; }
# ov_need_tool <binary...>: the load generators and clients must exist when the
# server does; a missing one is a broken setup, not a reason to skip.
ov_need_tool() { ov_need ov_fail "$@"; }
# ov_need <ov_skip|ov_fail> <binary...>: calls the first for each program not installed.
ov_need() {
  local act=$1 b
  shift
  for b in "$@"; do
    [[ -x "$b" ]] || command -v "$b" >/dev/null 2>&1 ||
      "$act" "$b not installed (scripts/install-deps.sh installs it)"
  done
}

# ov_init <libkeel.so>: checks the argument, makes the throw-away dir, sets the traps.
ov_init() {
  [[ $# -ge 1 && -n "$1" ]] || ov_fail "usage: $0 /path/to/libkeel.so"
  [[ -f "$1" ]] || ov_fail "library not found: $1 (build target keel first)"
  # The canonical path: that is what /proc/<pid>/maps shows.
  OV_LIB=$(readlink -f "$1")
  OV_TMP=$(mktemp -d "${TMPDIR:-/tmp}/keel-override-$OV_NAME.XXXXXX")
  chmod 755 "$OV_TMP"
  trap ov_cleanup EXIT
  trap 'ov_log "interrupted"; exit 130' INT
  trap 'ov_log "terminated"; exit 143' TERM
  # Whoever read our output is gone (ctest killed, a pipe closed): SIGPIPE's default
  # action would end the script without its EXIT trap and leave the servers running.
  trap 'exec >/dev/null 2>&1; exit 141' PIPE
  trap 'exec >/dev/null 2>&1; exit 129' HUP
  ov_log "preloading $OV_LIB"
  ov_log "work dir $OV_TMP"
}

ov_expect_stats() { [[ "${KEEL_OVERRIDE_EXPECT_STATS:-1}" != 0 ]]; }

# ov_free_port: prints a TCP port on 127.0.0.1 that was free a moment ago.
ov_free_port() {
  /usr/bin/python3 -c '
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()'
}

# ov_running <pid>: true while the process exists and is not a zombie.
ov_running() {
  local st
  [[ -r /proc/$1/stat ]] || return 1
  st=$(sed -e 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [[ -n "$st" && "$st" != Z && "$st" != X ]]
}

# ov_children <pid>: the children of a process, as "pid:start-time" words.
ov_children() {
  local c
  for c in $(ps -o pid= --ppid "$1" 2>/dev/null || true); do
    echo -n "$c:$(ov_start_time "$c") "
  done
}
# ov_start_time <pid>: the process's start time (field 22 of /proc/<pid>/stat).
ov_start_time() { sed -e 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }
# ov_same_process <pid:start-time>: that very process still runs.
ov_same_process() {
  local pid=${1%%:*} t=${1#*:}
  ov_running "$pid" && [[ "$(ov_start_time "$pid")" == "$t" ]]
}

# ov_register <pid> <label> [log files...]: the process is stopped at exit whatever happens.
ov_register() {
  local pid=$1 what=$2
  shift 2
  OV_PIDS+=("$pid")
  OV_PID_WHAT[$pid]=$what
  OV_PID_LOGS[$pid]="$*"
}

# ov_stop <pid> [timeout]: SIGTERM, wait, SIGKILL (and stop its leftover children).
# Reaps the process and sets OV_STOP_STATUS to its exit status (128+n for signal n;
# 255 if it had to be killed or was not our child).
OV_STOP_STATUS=0
ov_stop() {
  local pid=$1 timeout=${2:-${KEEL_OVERRIDE_STOP_TIMEOUT:-30}} what=${OV_PID_WHAT[$1]:-pid $1}
  local kids="" deadline killed=0 i
  OV_STOP_STATUS=0
  if ov_running "$pid"; then
    kids=$(ov_children "$pid")
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + timeout))
    while ov_running "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
    if ov_running "$pid"; then
      ov_log "$what (pid $pid) still running ${timeout}s after SIGTERM: SIGKILL"
      kids="$kids $(ov_children "$pid")"
      kill -KILL "$pid" 2>/dev/null || true
      killed=1
    fi
  fi
  # Children of a killed server (e.g. postgres backends) must not outlive it. They
  # normally exit by themselves when their parent dies: give them a moment, then
  # SIGTERM, then SIGKILL.
  # Each child is identified by pid:start-time, so a recycled pid is never signalled.
  kids=$(tr ' ' '\n' <<<"$kids" | sort -u | tr '\n' ' ')
  local sig
  for sig in none TERM KILL; do
    if [[ $sig != none ]]; then
      ov_log "sending SIG$sig to leftover children of $what:$kids"
      for i in $kids; do ov_same_process "$i" && kill -"$sig" "${i%%:*}" 2>/dev/null; done
    fi
    deadline=$((SECONDS + 5))
    while :; do
      local left=""
      for i in $kids; do ov_same_process "$i" && left="$left $i"; done
      kids=$left
      [[ -n "$kids" ]] && ((SECONDS < deadline)) || break
      sleep 0.2
    done
    [[ -n "$kids" ]] || break
  done
  if wait "$pid" 2>/dev/null; then OV_STOP_STATUS=0; else OV_STOP_STATUS=$?; fi
  ((killed)) && OV_STOP_STATUS=255
  # Forget it: the EXIT trap must not touch a pid the kernel may have reused.
  local keep=() p
  for p in "${OV_PIDS[@]}"; do [[ "$p" == "$pid" ]] || keep+=("$p"); done
  OV_PIDS=("${keep[@]+"${keep[@]}"}")
  return 0
}

# ov_stop_checked <pid>: stops a server and requires a clean exit status (0).
ov_stop_checked() {
  local pid=$1 what=${OV_PID_WHAT[$1]:-pid $1}
  ov_log "stopping $what (pid $pid) with SIGTERM"
  ov_stop "$pid"
  ((OV_STOP_STATUS == 0)) || ov_fail "$what exited with status $OV_STOP_STATUS after SIGTERM$(ov_status_hint "$OV_STOP_STATUS")"
  ov_log "$what exited cleanly"
}

ov_status_hint() {
  local s=$1
  ((s == 255)) && { echo " (had to be SIGKILLed)"; return; }
  ((s > 128)) && echo " (killed by signal $((s - 128)): $(kill -l $((s - 128)) 2>/dev/null || echo '?'))"
  return 0
}

# ov_tail <file> [lines]: prints the end of a log, framed.
ov_tail() {
  local f=$1 n=${2:-40}
  [[ -s "$f" ]] || return 0
  echo "----- last $n lines of $f -----" >&2
  tr "\r" "\n" <"$f" | tail -n "$n" >&2 || true
  echo "----- end of $f -----" >&2
}

# ov_check_maps <pid> <label>: (a) the running process maps the preloaded library.
ov_check_maps() {
  local pid=$1 what=$2
  ov_running "$pid" || ov_fail "$what (pid $pid) is not running"
  if grep -qF "$OV_LIB" "/proc/$pid/maps" 2>/dev/null; then
    ov_log "ok: /proc/$pid/maps of $what contains $OV_LIB"
  else
    echo "mapped shared objects of $what:" >&2
    awk '$6 ~ /\.so/ {print "  " $6}' "/proc/$pid/maps" 2>/dev/null | sort -u >&2 || true
    ov_fail "/proc/$pid/maps of $what does not contain $OV_LIB: the preload did not take"
  fi
}

# ov_check_stats <stderr log> <label> [pid]: (b) Keel's exit statistics are in the log.
# With a pid, and when the heading names pids ("keel: statistics (pid N) ..."), one of
# the blocks must come from that very process (a server's forked children, e.g.
# postgres backends, print their own blocks into the same log).
ov_check_stats() {
  local log=$1 what=$2 pid=${3:-} n
  n=$(grep -c '^keel: statistics' "$log" 2>/dev/null || true)
  if ((n > 0)); then
    if [[ -n "$pid" ]] && grep -q '^keel: statistics (pid [0-9]' "$log" &&
       ! grep -q "^keel: statistics (pid $pid)" "$log"; then
      ov_fail "stderr of $what has $n 'keel: statistics' block(s), but none from pid $pid itself"
    fi
    ov_log "ok: stderr of $what has $n 'keel: statistics' block(s)${pid:+, one from pid $pid}"
    if [[ -n "$pid" ]]; then
      grep -A20 "^keel: statistics (pid $pid)" "$log" |
        grep -E '^keel: +(allocated|mapped|threads_total) ' | sed 's/^/    /' | tr -s ' ' || true
    fi
    return 0
  elif ov_expect_stats; then
    ov_fail "stderr of $what ($log) has no line starting with 'keel: statistics' (KEEL_STATS=1 was set)"
  else
    ov_log "note: no 'keel: statistics' in $what's stderr; not required (KEEL_OVERRIDE_EXPECT_STATS=0)"
  fi
}

# ov_wait_for <seconds> <pid> <label> <command...>: polls the command until it succeeds;
# fails early if the server died.
ov_wait_for() {
  local secs=$1 pid=$2 what=$3
  shift 3
  local deadline=$((SECONDS + secs))
  while ! "$@" >/dev/null 2>&1; do
    if ! ov_running "$pid"; then
      local st=0
      wait "$pid" 2>/dev/null || st=$?
      ov_fail "$what (pid $pid) died during start-up, status $st$(ov_status_hint "$st")"
    fi
    ((SECONDS < deadline)) || ov_fail "$what (pid $pid) not ready after ${secs}s"
    sleep 0.25
  done
}

# ov_run [-o <out>] [-e <err>] <command...>: runs a (long) client command and waits for
# it in a way a signal can interrupt, so INT/TERM reach the cleanup at once, which then
# stops the command too. -o: the command's stdout (and stderr, unless -e) go to <out>;
# -e: its stderr goes to <err>. Don't redirect the call of ov_run itself: the cleanup's
# messages would land in that file. stdin is /dev/null. Returns the command's status.
OV_FG_PID=""
ov_run() {
  local st=0 o="" e=""
  while [[ $# -gt 0 ]]; do
    case $1 in
      -o) o=$2; shift 2 ;;
      -e) e=$2; shift 2 ;;
      *) break ;;
    esac
  done
  if [[ -n "$o" && -n "$e" ]]; then "$@" </dev/null >"$o" 2>"$e" &
  elif [[ -n "$o" ]]; then "$@" </dev/null >"$o" 2>&1 &
  elif [[ -n "$e" ]]; then "$@" </dev/null 2>"$e" &
  else "$@" </dev/null &
  fi
  OV_FG_PID=$!
  wait "$OV_FG_PID" || st=$?
  OV_FG_PID=""
  return "$st"
}

ov_cleanup() {
  local rc=$? pid
  trap - EXIT INT TERM PIPE HUP
  set +e
  if [[ -n "$OV_FG_PID" ]] && ov_running "$OV_FG_PID"; then
    ov_log "cleanup: stopping client command (pid $OV_FG_PID)"
    kill -TERM "$OV_FG_PID" 2>/dev/null
    local d=$((SECONDS + 10))
    while ov_running "$OV_FG_PID" && ((SECONDS < d)); do sleep 0.2; done
    ov_running "$OV_FG_PID" && kill -KILL "$OV_FG_PID" 2>/dev/null
    wait "$OV_FG_PID" 2>/dev/null
  fi
  for pid in "${OV_PIDS[@]+"${OV_PIDS[@]}"}"; do
    ov_log "cleanup: stopping ${OV_PID_WHAT[$pid]:-pid $pid} (pid $pid)"
    ov_stop "$pid" 20
    ov_log "cleanup: ${OV_PID_WHAT[$pid]:-pid $pid} exit status $OV_STOP_STATUS$(ov_status_hint "$OV_STOP_STATUS")"
  done
  if ((rc != 0 && rc != OV_SKIP)); then
    local f
    for pid in "${!OV_PID_LOGS[@]}"; do
      for f in ${OV_PID_LOGS[$pid]}; do ov_tail "$f" 100; done
    done
    for f in "${OV_LOGS[@]+"${OV_LOGS[@]}"}"; do ov_tail "$f" 40; done
    local cores
    cores=$(find "$OV_TMP" -maxdepth 3 -name 'core*' -type f 2>/dev/null | head -5)
    [[ -n "$cores" ]] && echo "core files: $cores" >&2
  fi
  if [[ -n "$OV_TMP" && -d "$OV_TMP" ]]; then
    if [[ "${KEEL_OVERRIDE_KEEP:-0}" != 0 ]]; then
      ov_log "kept $OV_TMP"
    else
      rm -rf "$OV_TMP"
    fi
  fi
  if ((rc == 0)); then ov_log "PASS (${SECONDS}s)"
  elif ((rc == OV_SKIP)); then :
  else ov_log "FAILED with status $rc (${SECONDS}s)"; fi
  exit "$rc"
}
