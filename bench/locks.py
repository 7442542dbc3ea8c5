#!/usr/bin/env python3
"""locks.py -- how much Keel's shared structures are contended as threads outnumber cores.

Runs the threaded bench/ programs under libkeel with 2, 8 and 64 threads (the total work
is the same at every thread count), reads Keel's lock counters at exit (KEEL_STATS=1:
acquisitions, acquisitions that found the lock held, waits in the kernel) and prints,
per program and thread count, the median wall time and, for the central free lists and
the page heap: acquisitions per 1,000 malloc+free pairs, the share that was contended
and the sleeps. Same machine-wide lock as run.py: one benchmark at a time.

    python3 bench/locks.py [--build-dir build] [--lib LIB] [--runs 3] [--threads 2,8,64]
                           [--programs xthread,larson,threadchurn,mpmc64,mpmcmix,workset]
                           [--scale 1] [--max N] [--json OUT]

--max N makes it a check: exit 1 if any program takes more than N central locks per
1,000 malloc+free pairs in each of its runs (tests/CMakeLists.txt runs it so). The
fewest of the runs is what is checked: a process that loses its core while between
its line and the next trips to the slabs more, so a loaded machine only adds trips
(mpmc64 at 8 threads: 0.1-1.2 on an idle 2-core VM, up to 10 beside a busy loop).
"""
import argparse
import fcntl
import json
import os
import re
import statistics
import subprocess
import sys
import time

# Pairs of malloc+free each program does, from its output line.
PAIRS = {
    "xthread": lambda out: int(re.search(r"objects=(\d+)", out).group(1)),
    "larson": lambda out: int(re.search(r"replacements=(\d+)", out).group(1)),
    "threadchurn": lambda out: int(re.search(r"thread_starts=(\d+)", out).group(1)) * 1500,
    "prodcons": lambda out: int(re.search(r"messages=(\d+)", out).group(1)),
    "mpmc64": lambda out: int(re.search(r"objects=(\d+)", out).group(1)),
    "mpmcmix": lambda out: int(re.search(r"objects=(\d+)", out).group(1)),
    "workset": lambda out: int(re.search(r"objects=(\d+)", out).group(1)),
}
LOCK_LINE = re.compile(r"^keel:\s+(central|page heap|huge|threads|metadata)\s+(\d+) / (\d+) / (\d+)$")


def threaded_programs():
    """Names whose line in programs.txt says they take a thread count."""
    here = os.path.dirname(os.path.abspath(__file__))
    names = set()
    with open(os.path.join(here, "programs.txt")) as f:
        for line in f:
            words = line.split()
            if words and not words[0].startswith("#") and len(words) > 1 and words[1] == "yes":
                names.add(words[0])
    return names


def run_once(prog, threads, lib, scale, threaded):
    env = dict(os.environ, LD_PRELOAD=lib, KEEL_STATS="1")
    t0 = time.monotonic()
    argv = [prog, str(scale)] + ([str(threads)] if threaded else [])
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"{prog} {threads}: exit {p.returncode}\n{p.stderr[-2000:]}")
    locks = {}
    for line in p.stderr.splitlines():
        m = LOCK_LINE.match(line)
        if m:
            locks[m.group(1)] = tuple(int(x) for x in m.groups()[1:])
    return wall, p.stdout, locks


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", default="2,8,64")
    ap.add_argument("--programs", default="xthread,larson,threadchurn,mpmc64,mpmcmix,workset")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--lib", help="the libkeel.so to run (default: BUILD_DIR/libkeel.so)")
    ap.add_argument("--max", type=float, metavar="N",
                    help="exit 1 if a program takes more than N central locks per 1,000 pairs")
    ap.add_argument("--json")
    a = ap.parse_args()
    lib = os.path.abspath(a.lib or os.path.join(a.build_dir, "libkeel.so"))
    threaded = threaded_programs()
    lock = open("/tmp/keel-bench.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    rows = []
    for name in a.programs.split(","):
        prog = os.path.join(a.build_dir, "bench", name)
        for threads in [int(t) for t in a.threads.split(",")]:
            runs = [run_once(prog, threads, lib, a.scale, name in threaded) for _ in range(a.runs)]
            walls = sorted(r[0] for r in runs)
            mid = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
            pairs = PAIRS[name](mid[1])
            fewest = min(r[2].get("central", (0, 0, 0))[0] * 1000.0 / PAIRS[name](r[1]) for r in runs)
            row = {"program": name, "threads": threads, "wall_s": statistics.median(walls),
                   "pairs": pairs, "central_fewest_per_1k": fewest,
                   "locks": {k: dict(zip(("acquired", "contended", "sleeps"), v)) for k, v in mid[2].items()}}
            rows.append(row)
    print(f"Keel lock counters, {a.runs} runs per point (median wall; counters of the median run)")
    print(f"{'program':12} {'threads':>7} {'wall s':>7} | {'central/1k':>10} {'contended':>9} {'sleeps':>7}"
          f" | {'pageheap/1k':>11} {'contended':>9} {'sleeps':>7}")
    for r in rows:
        c = r["locks"].get("central", {"acquired": 0, "contended": 0, "sleeps": 0})
        h = r["locks"].get("page heap", {"acquired": 0, "contended": 0, "sleeps": 0})
        k = 1000.0 / r["pairs"]
        pc = 100.0 * c["contended"] / max(c["acquired"], 1)
        ph = 100.0 * h["contended"] / max(h["acquired"], 1)
        print(f"{r['program']:12} {r['threads']:>7} {r['wall_s']:>7.3f} | {c['acquired'] * k:>10.2f} {pc:>8.2f}%"
              f" {c['sleeps']:>7} | {h['acquired'] * k:>11.3f} {ph:>8.2f}% {h['sleeps']:>7}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": a.runs, "rows": rows}, f, indent=1)
    if a.max is not None:
        over = [r for r in rows if r["central_fewest_per_1k"] > a.max]
        for r in over:
            print(f"FAILED: {r['program']} at {r['threads']} threads takes more than {a.max} central locks"
                  f" per 1,000 malloc+free pairs in every run (fewest: {r['central_fewest_per_1k']:.2f})")
        if over:
            sys.exit(1)


if __name__ == "__main__":
    main()
