#!/usr/bin/env bash
# The main job: installs what is missing, builds Keel, and runs the quick comparison of
# glibc, jemalloc, tcmalloc, mimalloc and Keel.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
bash scripts/install-deps.sh
bash scripts/build.sh
mkdir -p results
python3 bench/run.py --build-dir build --runs 3 --json results/bench.json
echo "results: $here/results/bench.json"
