#!/usr/bin/env bash
# Every test: installs what is missing, builds, runs ctest (api, unit, stress, misuse,
# override) and the lab's pytest suite. Exit status is non-zero if anything failed.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
bash scripts/install-deps.sh
bash scripts/build.sh
status=0
echo "== ctest"
ctest --test-dir build --output-on-failure -j2 || status=1
if [[ -d lab ]]; then
  echo "== lab (pytest)"
  bash scripts/setup-venv.sh
  .venv/bin/python -m pytest -q lab/tests || status=1
fi
exit $status
