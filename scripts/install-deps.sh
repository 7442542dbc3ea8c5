#!/usr/bin/env bash
# Installs everything Keel's build, tests and lab need on a fresh Debian 12 machine.
# Idempotent: packages already present are skipped by apt; the venv is reused.
# Usage: scripts/install-deps.sh [--no-servers] [--cross] [--package]
#   --cross    also the arm64 cross toolchain and qemu-user (scripts/cross-aarch64.sh)
#   --package  also Debian's packaging tools (scripts/package.sh, tests/package);
#              with --cross too, crossbuild-essential-arm64 for the arm64 .debs
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

build_pkgs=(build-essential cmake ninja-build pkg-config valgrind clang
            libclang-rt-14-dev python3-venv python3-pip)
# The allocators we compare against, exactly as Debian ships them.
alloc_pkgs=(libjemalloc2 libjemalloc-dev libtcmalloc-minimal4 libgoogle-perftools4
            libmimalloc2.0)
# Real servers and their load generators, for the override tests and the lab.
server_pkgs=(redis-server redis-tools mariadb-server mariadb-client sysbench
             postgresql postgresql-contrib python3 procps psmisc sphinxsearch)
# Safety evidence (issue 4): real programs' own test suites (scripts/suites.sh) and the
# soak's clients (scripts/soak.sh); the fuzzer needs clang + libclang-rt (above).
safety_pkgs=(libpython3.11-testsuite mariadb-test python3-redis python3-pymysql)
# The lab's report test opens the HTML report in headless Chromium.
lab_pkgs=(chromium)

# Issue 8, only when asked for: cross-building for arm64 and running it under qemu-user
# (--cross), and building the .deb packages (--package).
cross_pkgs=(gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user file)
package_pkgs=(debhelper dpkg-dev fakeroot)
package_cross_pkgs=(crossbuild-essential-arm64)

servers=1 cross=0 package=0
for arg in "$@"; do
  case $arg in
    --no-servers) servers=0 ;;
    --cross) cross=1 ;;
    --package) package=1 ;;
    *) echo "install-deps: unknown option $arg" >&2; exit 2 ;;
  esac
done
want=("${build_pkgs[@]}" "${alloc_pkgs[@]}")
((servers)) && want+=("${server_pkgs[@]}")
((servers)) && want+=("${safety_pkgs[@]}")
((servers)) && want+=("${lab_pkgs[@]}")
((cross)) && want+=("${cross_pkgs[@]}")
((package)) && want+=("${package_pkgs[@]}")
((package && cross)) && want+=("${package_cross_pkgs[@]}")

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo_cmd=""
  [[ $(id -u) -eq 0 ]] || sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  # policy-rc.d stops Debian's postinst from starting the servers system-wide:
  # Keel's scripts start their own throw-away instances on 127.0.0.1.
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo_cmd tee /usr/sbin/policy-rc.d >/dev/null
    $sudo_cmd chmod +x /usr/sbin/policy-rc.d
    trap '$sudo_cmd rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "install-deps: system packages ready (${#missing[@]} installed now)"
