#!/usr/bin/env bash
# The main job: installs what is missing, builds Keel and the lab, and runs the quick
# comparison of glibc, jemalloc, tcmalloc, mimalloc and Keel on redis-frag, threads and
# micro. Prints the summary table, the recommendation and where the HTML report is.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
bash scripts/install-deps.sh
bash scripts/build.sh
bash scripts/setup-venv.sh
mkdir -p results
out=results/quick-$(date +%Y%m%d-%H%M%S).json
.venv/bin/keel bench redis-frag threads micro --quick --rounds ${KEEL_ROUNDS:-2} \
  --allocators glibc,jemalloc,tcmalloc,mimalloc,keel --out "$out"
.venv/bin/keel recommend "$out"
.venv/bin/keel report "$out" -o "${out%.json}.html"
echo "results: $here/$out"
echo "report:  $here/${out%.json}.html"
