#!/usr/bin/env bash
# Builds Keel's Debian packages (debian/) with Debian's own tooling, dpkg-buildpackage,
# in a clean copy of the tree, and puts the .debs in build-deb/ (or --out DIR).
#
# Usage: scripts/package.sh [--arch amd64|arm64|both] [--out DIR] [--nocheck]
#   --arch     the host architecture of the packages (default: this machine's). Another
#              one is cross-built (dpkg-buildpackage -a<arch>) with Debian's cross
#              toolchain (crossbuild-essential-<arch>); its tests are skipped there and
#              run under qemu by scripts/cross-aarch64.sh instead
#   --nocheck  DEB_BUILD_OPTIONS=nocheck: no test suites in the build
# Installs missing build tools first (scripts/install-deps.sh --package [--cross]).
# Packages: libkeel0_<version>_<arch>.deb (the library), libkeel-dev_<version>_<arch>.deb
# (keel.h, libkeel.so, libkeel.a, keel.pc), and the automatic -dbgsym .debs.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=$here/build-deb
build_arch=$(dpkg --print-architecture)
archs=("$build_arch")
nocheck=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --arch)
      case $2 in
        both) archs=(amd64 arm64) ;;
        *) archs=("$2") ;;
      esac
      shift 2 ;;
    --out) out=$(realpath -m "$2"); shift 2 ;;
    --nocheck) nocheck=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "package: unknown option $1" >&2; exit 2 ;;
  esac
done
log() { printf '== package: %s\n' "$*"; }

cross=0
for a in "${archs[@]}"; do [[ $a == "$build_arch" ]] || cross=1; done
need=(dpkg-buildpackage dh fakeroot cmake ninja)
((cross)) && need+=(aarch64-linux-gnu-gcc aarch64-linux-gnu-g++)
for t in "${need[@]}"; do
  if ! command -v "$t" >/dev/null; then
    opts=(--package --no-servers)
    ((cross)) && opts+=(--cross)
    log "$t missing: scripts/install-deps.sh ${opts[*]}"
    bash "$here/scripts/install-deps.sh" "${opts[@]}"
    break
  fi
done

version=$(dpkg-parsechangelog -l "$here/debian/changelog" -S Version)
mkdir -p "$out"
status=0
for arch in "${archs[@]}"; do
  work=$(mktemp -d "${TMPDIR:-/tmp}/keel-deb.XXXXXX")
  src=$work/keel-${version%%-*}
  mkdir -p "$src"
  # The tree as git sees it (tracked and untracked, not ignored: no build trees, no
  # .venv, no results), or everything but those when this is not a git checkout.
  if git -C "$here" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$here" && git ls-files -co --exclude-standard -z | xargs -0 -r cp --parents -t "$src" 2>/dev/null) || true
  else
    tar -C "$here" --exclude='./build*' --exclude=./.venv --exclude=./results --exclude=./.git -cf - . |
      tar -C "$src" -xf -
  fi
  [[ -f $src/debian/rules && -f $src/CMakeLists.txt ]] || { log "copying the tree failed"; exit 1; }
  args=(-b -us -uc)
  envs=()
  if [[ $arch == "$build_arch" ]]; then
    ((nocheck)) && envs+=(DEB_BUILD_OPTIONS=nocheck)
  else
    # Cross: Debian's cross profile, and no tests (they run under qemu-user in
    # scripts/cross-aarch64.sh, not in the package build).
    args+=("-a$arch" -Pcross,nocheck)
    envs+=(DEB_BUILD_OPTIONS=nocheck)
  fi
  log "${envs[*]} dpkg-buildpackage ${args[*]} ($arch) in $src"
  rc=0
  (cd "$src" && env "${envs[@]}" dpkg-buildpackage "${args[@]}") >"$out/build-$arch.log" 2>&1 || rc=$?
  if ((rc != 0)); then
    log "FAILED ($arch), status $rc; last lines of $out/build-$arch.log:"
    tail -n 40 "$out/build-$arch.log"
    status=1
  else
    grep -E '^(dpkg-deb: building|[0-9]+% tests passed|keel: cross)' "$out/build-$arch.log" | sed 's/^/   /' || true
    for f in "$work"/*.deb "$work"/*.ddeb "$work"/*.buildinfo "$work"/*.changes; do
      [[ -e $f ]] && mv -f "$f" "$out/"
    done
    for d in "$out"/libkeel0_"$version"_"$arch".deb "$out"/libkeel-dev_"$version"_"$arch".deb; do
      log "$(basename "$d"):"
      dpkg-deb -f "$d" Package Version Architecture Multi-Arch Depends | sed 's/^/   /'
      dpkg-deb -c "$d" | awk '{print "   " $1 " " $6 ($7 ? " " $7 " " $8 : "")}'
    done
  fi
  rm -rf "$work"
done
((status == 0)) && log "packages in $out"
exit $status
