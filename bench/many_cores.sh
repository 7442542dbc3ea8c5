#!/usr/bin/env bash
# many_cores.sh -- the threaded bench/ programs at 4, 8 and 16 threads on a machine where
# nothing can be installed (a many-core box lent for a few minutes): everything it needs
# is packed here, on a Debian machine, into one folder that travels with the tree.
#
#   bash bench/many_cores.sh pack DIR [BASE_LIB [NAME=LIB ...]]
#       here: binaries, libkeel.so, Debian's allocators, a baseline libkeel ("keel-base")
#       and variants to run beside them ("keel-NAME": builds of other commits or flags)
#   bash bench/many_cores.sh run DIR OUT [THREADS]
#       there: run.py, 3 alternated rounds per thread count, JSON and tables under OUT
#       (PROGRAMS=a,b and RUNS=n narrow it: a lease is 15 minutes, starts included;
#       SETTINGS="own@KEEL_OWN_LINES=1 ..." adds libkeel.so run with those settings as
#       "keel-own": a policy compared without a second build)
#
# Each program's work is shared among its threads, so the scale grows with the thread
# count (threads/4: a run lasts about as long at 4, 8 and 16 threads) and the most
# threads go first. One run of a program is cut at 10 s (gperftools' tcmalloc took 52 s
# on a public producer/consumer program at 16 threads). The allocator libraries come
# from the packing machine, so the comparison is the same Debian versions everywhere;
# glibc is the one the run machine has (say which in the note).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:-}
case "$cmd" in
  pack)
    dir=${2:?usage: many_cores.sh pack DIR [BASE_LIB [NAME=LIB ...]]}
    base=${3:-}
    build=${KEEL_BUILD_DIR:-$here/build}
    mkdir -p "$dir/bench" "$dir/lib"
    cp "$build"/bench/* "$dir/bench/" 2>/dev/null || true
    rm -rf "$dir/bench/CMakeFiles"
    cp "$build/libkeel.so" "$dir/lib/libkeel.so"
    [[ -n "$base" ]] && cp -L "$base" "$dir/lib/libkeel-base.so"
    for variant in "${@:4}"; do cp -L "${variant#*=}" "$dir/lib/libkeel-${variant%%=*}.so"; done
    multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
    for f in libjemalloc.so.2 libtcmalloc_minimal.so.4 libmimalloc.so.2; do
      if [[ -f /usr/lib/$multiarch/$f ]]; then cp -L "/usr/lib/$multiarch/$f" "$dir/lib/"
      else echo "many_cores.sh: /usr/lib/$multiarch/$f missing (scripts/install-deps.sh installs it)" >&2; fi
    done
    # tcmalloc's and jemalloc's own dependencies beyond glibc (libstdc++, libgcc_s) are
    # on any machine that runs C++.
    du -sh "$dir"
    ;;
  run)
    dir=$(cd "${2:?usage: many_cores.sh run DIR OUT [THREADS]}" && pwd)
    out=${3:?usage: many_cores.sh run DIR OUT [THREADS]}
    threads=${4:-16,8,4}
    mkdir -p "$out"
    allocs="glibc"
    for pair in jemalloc=libjemalloc.so.2 tcmalloc=libtcmalloc_minimal.so.4 mimalloc=libmimalloc.so.2 \
                keel-base=libkeel-base.so keel=libkeel.so; do
      [[ -f "$dir/lib/${pair#*=}" ]] && allocs+=",${pair%%=*}=$dir/lib/${pair#*=}"
    done
    for lib in "$dir"/lib/libkeel-*.so; do
      name=$(basename "$lib" .so); name=${name#lib}
      [[ -f "$lib" && "$name" != keel-base ]] && allocs+=",$name=$lib"
    done
    for s in ${SETTINGS:-}; do allocs+=",keel-${s%%@*}=$dir/lib/libkeel.so@${s#*@}"; done
    progs=${PROGRAMS:-$(awk '!/^#/ && $2 == "yes" {printf "%s%s", sep, $1; sep=","}' "$here/bench/programs.txt")}
    { nproc; ldd --version 2>&1 | sed -n 1p; uname -r; grep -m1 'model name' /proc/cpuinfo; } > "$out/cpus.txt"
    for t in ${threads//,/ }; do
      python3 "$here/bench/run.py" --bench-dir "$dir/bench" --allocators "$allocs" --programs "$progs" \
        --threads "$t" --scale "$(awk -v t="$t" 'BEGIN { print (t < 4 ? 1 : t / 4) }')" --runs "${RUNS:-3}" \
        --timeout 10 --skip-missing --no-lock --json "$out/threads-$t.json" 2>&1 | tee "$out/threads-$t.txt"
    done
    ;;
  *)
    sed -n '2,/^set /{/^#/p}' "$0" >&2
    exit 2
    ;;
esac
