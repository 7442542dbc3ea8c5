#!/usr/bin/env bash
# Configures and builds Keel (library, tests, benchmarks) into ./build (or $KEEL_BUILD_DIR).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${KEEL_BUILD_DIR:-$here/build}
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${KEEL_BUILD_TYPE:-Release} "$@" >/dev/null
cmake --build "$build"
echo "build: $build/libkeel.so"
