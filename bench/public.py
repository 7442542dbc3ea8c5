#!/usr/bin/env python3
"""Runs public allocator benchmark programs - the ones mimalloc-bench collects, from a
checkout of it - under several allocators, alternated, and compares their scores and
peak RSS.

bench/ holds programs written for Keel; these were written by others, for other
allocators, and are what allocators are compared on in public. Their sources are not in
this repository: point --src at a checkout of https://github.com/daanx/mimalloc-bench
(its bench/ folder, or the checkout's root). Each program is built here with the system
compilers (-O2, the defines mimalloc-bench's CMakeLists.txt gives it) into --out, and run
with the arguments mimalloc-bench's bench.sh gives it, the thread count replaced by
--threads. Programs that cannot be built (rptest needs rpmalloc-benchmark's thread.c and
timer.c beside it) are skipped with the reason.

    python3 bench/public.py --src ~/mimalloc-bench --runs 3
    python3 bench/public.py --src ~/mimalloc-bench --allocators glibc,keel,new=/tmp/libkeel.so

A program's score is the figure it prints where it prints one (larson and xmalloc-test
a time, rptest operations a CPU second, glibc-thread iterations in 2 s), else its wall
time; every figure is turned into "lower is better" so that ratios read alike.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run  # noqa: E402  (bench/run.py: allocators, the measure launcher, the lock)

CFLAGS = ["-O2", "-pthread", "-DNDEBUG", "-w"]


def time_from(regex):
    return lambda out, wall: float(re.search(regex, out).group(1))


def per_rate(regex, unit):
    """A rate printed (higher is better) as the time `unit` operations take."""
    return lambda out, wall: unit / float(re.search(regex, out).group(1))


def wall_time(out, wall):
    return wall


# name, binary, sources (under bench/), compiler, extra flags, arguments ({t}: threads), score.
PROGRAMS = [
    ("larson", "larson", ["larson/larson.cpp"], "c++", ["-DCPP=1"], "5 8 1000 5000 100 4141 {t}",
     time_from(r"relative time: ([\d.]+)s")),
    ("xmalloc-test", "xmalloc-test", ["xmalloc-test/xmalloc-test.c"], "cc", [], "-w {t} -t 5 -s 64",
     time_from(r"rtime: ([\d.]+)")),
    ("cache-scratch1", "cache-scratch", ["cache-scratch/cache-scratch.cpp"], "c++", [], "1 1000 1 2000000 {t}", wall_time),
    ("cache-scratchN", "cache-scratch", ["cache-scratch/cache-scratch.cpp"], "c++", [], "{t} 1000 1 2000000 {t}", wall_time),
    ("cache-thrash1", "cache-thrash", ["cache-thrash/cache-thrash.cpp"], "c++", [], "1 1000 1 2000000 {t}", wall_time),
    ("cache-thrashN", "cache-thrash", ["cache-thrash/cache-thrash.cpp"], "c++", [], "{t} 1000 1 2000000 {t}", wall_time),
    ("mstress", "mstress", ["mstress/mstress.c"], "cc", [], "{t} 50 25", wall_time),
    ("rptest", "rptest", ["rptest/rptest.c", "rptest/thread.c", "rptest/timer.c"], "cc", ["-lm"],
     "{t} 0 1 2 500 1000 100 8 16000", per_rate(r"(\d+) memory ops/CPU second", 1e7)),
    ("glibc-simple", "glibc-simple", ["glibc-bench/bench-malloc-simple.c"], "cc", [], "", wall_time),
    ("glibc-thread", "glibc-thread", ["glibc-bench/bench-malloc-thread.c"], "cc", ["-lm"], "{t}",
     per_rate(r"(\d+) iterations", 1e8)),
    ("alloc-test1", "alloc-test", ["alloc-test/test_common.cpp", "alloc-test/allocator_tester.cpp"], "c++",
     ["-std=c++17", "-DBENCH=4"], "1", wall_time),
    ("alloc-testN", "alloc-test", ["alloc-test/test_common.cpp", "alloc-test/allocator_tester.cpp"], "c++",
     ["-std=c++17", "-DBENCH=4"], "{t}", wall_time),
    ("malloc-large", "malloc-large", ["malloc-large/malloc-large.cpp"], "c++", ["-std=c++17"], "", wall_time),
]


def build(src, out, only):
    """Builds each wanted program into out; returns {name: path} and prints what was skipped."""
    built, binaries = {}, {}
    for name, binary, sources, lang, flags, _, _ in PROGRAMS:
        if only and name not in only:
            continue
        key = binary
        if key not in binaries:
            paths = [os.path.join(src, s) for s in sources]
            missing = [p for p in paths if not os.path.isfile(p)]
            exe = os.path.join(out, binary)
            compiler = os.environ.get("CXX", "g++") if lang == "c++" else os.environ.get("CC", "gcc")
            if missing:
                binaries[key] = "missing " + ", ".join(os.path.relpath(p, src) for p in missing)
            else:
                libs = [f for f in flags if f.startswith("-l")]
                cmd = [compiler] + CFLAGS + [f for f in flags if not f.startswith("-l")] + \
                      ["-I" + os.path.dirname(paths[0])] + paths + ["-o", exe] + libs
                r = subprocess.run(cmd, capture_output=True, text=True)
                binaries[key] = exe if r.returncode == 0 else "build failed: " + run.tail(r.stderr, 4)
        if os.path.isfile(binaries[key]):
            built[name] = binaries[key]
        else:
            run.eprint("public.py: %s skipped (%s)" % (name, binaries[key]))
    return built


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True, help="a mimalloc-bench checkout (or its bench/ folder)")
    ap.add_argument("--out", default="build/public", help="where the programs are built (build/public)")
    ap.add_argument("--build-dir", default="./build", help="CMake build directory: libkeel.so and bench/measure")
    ap.add_argument("--allocators", default=run.DEFAULT_ALLOCATORS,
                    help="as bench/run.py's: names or NAME=/path/to/lib.so (default: %s)" % run.DEFAULT_ALLOCATORS)
    ap.add_argument("--runs", type=int, default=3, help="alternated rounds (default 3)")
    ap.add_argument("--threads", type=int, default=2, help="threads for the threaded programs (default 2)")
    ap.add_argument("--programs", default=None, help="comma-separated subset: " + ",".join(p[0] for p in PROGRAMS))
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds before a run is killed (default 300)")
    args = ap.parse_args()
    src = os.path.abspath(os.path.expanduser(args.src))
    if os.path.isdir(os.path.join(src, "bench")):
        src = os.path.join(src, "bench")
    only = set(args.programs.split(",")) if args.programs else None
    if only and only - {p[0] for p in PROGRAMS}:
        ap.error("unknown program(s): " + ",".join(sorted(only - {p[0] for p in PROGRAMS})))
    build_dir = os.path.abspath(args.build_dir)
    try:
        allocs = run.resolve_allocators(args.allocators, build_dir)
    except run.SetupError as e:
        ap.error(str(e))
    for a in allocs:
        if a.problem:
            ap.error(a.problem)
    measure = os.path.join(build_dir, "bench", "measure")
    if not os.access(measure, os.X_OK):
        ap.error("%s not found: build the project first (scripts/build.sh)" % measure)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    built = build(src, out, only)
    if not built:
        sys.exit("public.py: nothing was built from %s" % src)

    lock = run.acquire_lock()
    scores = {}  # (program, allocator) -> [(score, peak KiB)]
    work = tempfile.mkdtemp(prefix="keel-public-")
    os.chdir(work)  # rptest writes its report into the current directory
    try:
        names = [a.name for a in allocs]
        for r in range(args.runs):
            for pi, (name, _, _, _, _, argfmt, score) in enumerate(p for p in PROGRAMS if p[0] in built):
                turn = (r + pi) % len(allocs)  # rotated, so no allocator always runs first
                for a in allocs[turn:] + allocs[:turn]:
                    res = run.run_once(built[name], argfmt.format(t=args.threads).split(), a, measure,
                                       args.timeout, work, checksum=False)
                    text = (res.get("stdout") or "") + "\n" + (res.get("stderr") or "")
                    if res["ok"]:
                        try:
                            value = score(text, res["wall_s"])
                        except (AttributeError, ValueError):
                            res["ok"], res["error"] = False, "no score in its output:\n" + run.tail(text, 4)
                    if not res["ok"]:
                        sys.exit("public.py: %s under %s failed: %s" % (name, a.name, res["error"]))
                    scores.setdefault((name, a.name), []).append((value, res["peak_kib"]))
                    print("round %d %-15s %-10s score %9.3f  peak %8.1f MiB" % (
                        r + 1, name, a.name, value, res["peak_kib"] / 1024), flush=True)
    finally:
        os.chdir(HERE)
        shutil.rmtree(work, ignore_errors=True)
        if lock:
            lock.close()

    print("\nmedians of %d alternated rounds, %d threads; score (lower is better) and x the best; "
          "peak RSS MiB and x the leanest" % (args.runs, args.threads))
    rows = [["program"] + names]
    times, peaks = {n: [] for n in names}, {n: [] for n in names}
    for name in [p[0] for p in PROGRAMS if p[0] in built]:
        med = {n: statistics.median(v for v, _ in scores[(name, n)]) for n in names}
        peak = {n: statistics.median(k for _, k in scores[(name, n)]) / 1024 for n in names}
        best, lean = min(med.values()), min(peak.values())
        for n in names:
            times[n].append(med[n] / best)
            peaks[n].append(peak[n] / lean)
        rows.append([name] + ["%.3f %.2fx, %.1f MiB %.2fx" % (med[n], med[n] / best, peak[n], peak[n] / lean)
                              for n in names])
    rows.append(["geomean"] + ["%.2fx (worst %.2fx), RSS %.2fx" % (run.geomean(times[n]), max(times[n]),
                                                                   run.geomean(peaks[n])) for n in names])
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) if c == 0 else cell.rjust(w) for c, (cell, w) in enumerate(zip(row, widths))))


if __name__ == "__main__":
    main()
