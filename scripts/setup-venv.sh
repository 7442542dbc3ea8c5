#!/usr/bin/env bash
# Creates ./.venv with the Keel lab (the `keel` command) and its test dependencies.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
py=/usr/bin/python3   # Debian's Python 3.11 (the first python3 on PATH may be a shim)
[[ -x $py ]] || py=$(command -v python3)
if [[ ! -x $here/.venv/bin/python ]]; then
  "$py" -m venv "$here/.venv"
fi
"$here/.venv/bin/pip" install -q --upgrade pip >/dev/null
"$here/.venv/bin/pip" install -q -e "$here/lab[test]"
echo "venv: $here/.venv (keel: $here/.venv/bin/keel)"
