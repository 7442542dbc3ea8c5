#!/usr/bin/env bash
# Every header of the library compiles on its own, with the library's flags, and twice in
# a row (its include guard): each header includes exactly what it uses, so internal.h's
# split by concern (src/core/*.h) stays honest. Only -fsyntax-only: about a second.
# Usage: headers.sh SOURCE_DIR CC [FLAGS...]
set -uo pipefail
root=$1 cc=$2
shift 2
passed=0 failed=0
for h in "$root"/src/core/*.h "$root"/src/platform/*.h "$root"/src/api/*.h; do
  rel=${h#"$root"/src/}
  if out=$(printf '#include "%s"\n#include "%s"\n' "$rel" "$rel" |
      "$cc" "$@" -I"$root/src" -I"$root/include" -Werror -fsyntax-only -x c - 2>&1); then
    passed=$((passed + 1))
  else
    echo "FAIL: $rel does not compile on its own:"
    echo "$out"
    failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
((failed == 0 && passed > 0))
