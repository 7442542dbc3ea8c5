#!/usr/bin/env bash
# Every test, on a fresh Debian 12 machine: installs what is missing, builds, then runs
#   ctest        api, unit (incl. the fast-path golden count), stress, misuse (default and
#                checked mode), faults, override (python3, redis, mariadb, postgres under
#                LD_PRELOAD), jemalloc API, fuzz (regressions + 60 s), suites (CPython and
#                MariaDB test subsets), soak (60 s), pagesize, bench (locality.py's model,
#                atomics.py's count)
#   sanitizers   UBSan, TSan and the KEEL_DEBUG=2 invariant-walk build (scripts/sanitize.sh)
#   arm64        cross-built suites under qemu-user, 64 KiB pages + 512 MiB huge page
#   package      the .deb built, installed, MariaDB through mysqld_safe --malloc-lib, removed
#   lab          the `keel` command's pytest suite (real servers, headless Chromium)
# Exit status is non-zero if anything failed; the last lines say what.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
bash scripts/install-deps.sh --cross --package || exit 1
bash scripts/build.sh || exit 1
bash scripts/setup-venv.sh || exit 1
failed=()
stage() { # stage NAME COMMAND...: runs one stage and remembers a failure
  local name=$1; shift
  echo "== $name"
  local t0=$SECONDS
  "$@"
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - t0)) s"
  ((rc == 0 || rc == 77)) || failed+=("$name")
}
stage ctest ctest --test-dir build --output-on-failure -j2
stage sanitizers bash scripts/sanitize.sh
stage arm64 bash scripts/cross-aarch64.sh
stage package bash tests/package/test_package.sh --arm64
stage lab .venv/bin/python -m pytest -q lab/tests
if ((${#failed[@]})); then
  echo "FAILED stages: ${failed[*]}"
  exit 1
fi
echo "all stages passed"
