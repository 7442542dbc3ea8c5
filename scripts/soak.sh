#!/usr/bin/env bash
# Soak: Redis and MariaDB under Keel with continuous mixed load, RSS sampled every second,
# every value read back and checked (tests/soak/soak.sh, tests/soak/soak_load.py).
#
# Usage: scripts/soak.sh [--seconds N] [--only redis|mariadb] [--alloc keel|glibc|both]
#                        [--lib PATH] [--results DIR]
#   --seconds   per server (default 300: `make soak` = 10 minutes; CI: 60)
#   --alloc     default keel; `both` also runs the same soak under glibc first, for
#               comparison (it is judged by the same bounds)
# Servers run one after the other. Reports: <results>/<alloc>-<server>.json (default
# results/soak), one summary line each. Exit status non-zero if a Keel soak failed.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/scripts/lib/runner.sh"
secs=300 only="redis mariadb" alloc=keel lib=$here/build/libkeel.so results=$here/results/soak
USAGE="[--seconds N] [--only redis|mariadb] [--alloc keel|glibc|both] [--lib PATH] [--results DIR]"
runner_own_option() {
  case $1 in
    --seconds) secs=$2 ;;
    *) return 1 ;;
  esac
}
runner_parse "$@"
status=0 ran=0 summary=()
for s in $only; do
  for a in "${allocs[@]}"; do
    what=$a
    [[ $a == keel ]] && what=$lib
    line=$(bash "$here/tests/soak/soak.sh" "$s" "$what" "$secs" "$results/$a-$s.json" | tee /dev/stderr | grep '^soak .* under ')
    rc=${PIPESTATUS[0]}
    ((rc == 77)) && continue
    ran=$((ran + 1))
    summary+=("${line:-soak $s under $a: no result (status $rc)}")
    [[ $a == keel ]] && ((rc != 0)) && status=1
  done
done
echo "== soak summary"
for l in "${summary[@]}"; do echo "  $l"; done
((ran == 0)) && exit 77
exit $status
