#!/usr/bin/env bash
# run_small_address_space.sh -- Keel under an address-space limit (ulimit -v), where the
# page map cannot have its 4 GiB reservation and falls back to a smaller map covering a
# window of the address space (src/core/pagemap.c). With 3 GB and then 1 GB of address
# space: the page-size probe must see a read-only reservation smaller than 4 GiB (the
# fallback was taken) and pass its checks, and the cross-thread stress test must pass.
#
# Usage: run_small_address_space.sh <pagesize_probe> <test_xthread>
set -u
probe=${1:?usage: $0 <pagesize_probe> <test_xthread>}
xthread=${2:?usage: $0 <pagesize_probe> <test_xthread>}
fail=0
for kib in 3000000 1000000; do
  out=$( (ulimit -v "$kib" && exec "$probe" --json --threads 16) ) || { echo "FAIL: probe under ulimit -v $kib"; fail=1; }
  ro=$(grep -o '"keel_ro": [0-9]*' <<<"$out" | head -1 | tr -dc 0-9)
  if [[ -z $ro ]] || (( ro == 0 || ro >= 4294967296 )); then
    echo "FAIL: ulimit -v $kib: page map reservation '$ro' bytes, want a reduced map (0 < size < 4 GiB)"
    fail=1
  else
    echo "ulimit -v $kib KiB: page map reduced to $((ro >> 20)) MiB"
  fi
  (ulimit -v "$kib" && exec "$probe" --threads 16 --check) >/dev/null ||
    { echo "FAIL: pagesize checks under ulimit -v $kib"; fail=1; }
done
# The stress test's threads need their stacks inside the limit too: 3 GB is plenty.
if (ulimit -v 3000000 && exec timeout 120 "$xthread") >/tmp/keel-xthread-as.$$ 2>&1; then
  echo "cross-thread stress under ulimit -v 3000000: $(tail -1 /tmp/keel-xthread-as.$$)"
else
  echo "FAIL: cross-thread stress under ulimit -v 3000000"; tail -5 /tmp/keel-xthread-as.$$; fail=1
fi
rm -f /tmp/keel-xthread-as.$$
if (( fail )); then echo "0 passed, 1 failed"; exit 1; fi
echo "1 passed, 0 failed"
