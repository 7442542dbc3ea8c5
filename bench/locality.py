#!/usr/bin/env python3
"""locality.py -- how well an allocator's placement keeps a program's blocks in cache.

Runs a program under each allocator with a shim preloaded in front of it
(locality_shim.c) that records the address and size of every malloc and calloc of up to
128 KiB and the address of every free, then replays the record through a model of one
cache level: at each allocation the program is taken to write the block's first, middle
and last line, at each free its first (where allocators keep their links). It prints,
per allocator, the mallocs recorded, the model's misses per 1,000 of them and the
distinct 4 KiB pages the blocks covered.

The count needs no hardware counters and, for a single-threaded program, repeats
exactly; a threaded program's record interleaves its threads as they ran. By default
they share one cache (threads on one processor); --per-thread gives each its own, as
threads on processors of their own, and a write to a line takes it out of the other
threads' caches, so a block one thread freed and another got counts as a miss. What it leaves out: the allocator's own
accesses (its metadata, the links it writes), the program's other memory, and the
blocks' later use. Where an allocator hands back the blocks freed last, the model
hits; where it hands out blocks freed long ago, or spreads a working set over more
pages, it misses (docs/experiments.md, "What workset's time is made of").

    python3 bench/locality.py [--allocators glibc,mimalloc,keel] [--cache BYTES]
                              [--ways N] [--per-thread] [--why] [--build-dir build] -- PROGRAM [ARGS...]

--why splits the misses: lines never touched before (cold); lines the thread's own cache
let go, last held by a block of the same size or of another (memory a size class kept
while others ran, or memory that went from one class to another); with --per-thread,
lines another thread wrote last, same size or other; and "passed", the mallocs that got
a block another thread freed last.

--cache defaults to this machine's second-level cache (sysfs), --ways 0 models it fully
associative; --ways N sets it N-way, indexed by virtual address, which is what a cache
sees where huge pages back the heap, not with 4 KiB pages (the physical frames behind
them scatter the sets).
"""
import argparse
import array
import collections
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import SetupError, resolve_present, tool_parser  # noqa: E402

LINE = 64
PAGE = 4096


def second_level_cache_bytes():
    """The size of cpu0's level-2 data or unified cache from sysfs, else 1 MiB."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(base)):
            d = os.path.join(base, entry)
            with open(os.path.join(d, "level")) as f:
                level = f.read().strip()
            with open(os.path.join(d, "type")) as f:
                kind = f.read().strip()
            if level == "2" and kind in ("Data", "Unified"):
                with open(os.path.join(d, "size")) as f:
                    text = f.read().strip()
                mult = {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1)
                return int(text.rstrip("KM")) * mult
    except (OSError, ValueError):
        pass
    return 1 << 20


def build_shim(out_dir):
    shim = os.path.join(out_dir, "locality_shim.so")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", shim, os.path.join(HERE, "locality_shim.c"), "-ldl"],
                   check=True)
    return shim


# What a miss is (--why): a line never touched before; one last touched by a block of the
# same size, or of another size, in this thread's own cache, that the cache let go; one
# another thread wrote last, which took it from this one's (--per-thread only).
WHY = ("cold", "own, same size", "own, other size", "other thread, same size", "other thread, other size")


def replay(path, cache_bytes, ways, per_thread=False, why=None):
    """(mallocs, misses, distinct pages) of the record at path. A dict passed as why gets
    the misses by kind (WHY) and "passed": mallocs of a block another thread freed last."""
    raw = array.array("Q")
    with open(path, "rb") as f:
        raw.frombytes(f.read())
    lines = cache_bytes // LINE
    nsets = 1 if ways == 0 else max(1, lines // ways)
    per_set = lines if ways == 0 else ways
    caches = {}  # thread (0 for all when shared) -> its sets
    writer = {}  # line -> the thread that wrote it last (per_thread)
    sized = {}   # line -> the size of the block that last had it (why)
    freer = {}   # block -> the thread that freed it last (why)
    misses = mallocs = 0
    pages = set()
    for i in range(0, len(raw), 2):
        addr, word = raw[i], raw[i + 1]
        size, thread = word & 0xFFFFFFFF, (word >> 32) if per_thread else 0
        mallocs += size != 0
        sets = caches.get(thread)
        if sets is None:
            sets = caches[thread] = [collections.OrderedDict() for _ in range(nsets)]
        if size:
            pages.add(addr // PAGE)
        if why is not None:
            if size:
                last = freer.get(addr)
                why["passed"] += last is not None and last != thread
            else:
                freer[addr] = thread
        for off in ({0, size // 2, size - 1} if size else (0,)):
            line = (addr + off) // LINE
            s = sets[line % nsets]
            taken = False  # another thread wrote the line last
            if per_thread:
                last = writer.get(line)
                if last is not None and last != thread:
                    caches[last][line % nsets].pop(line, None)  # the write invalidates it there
                    taken = True
                writer[line] = thread
            if line in s:
                s.move_to_end(line)
            else:
                misses += 1
                s[line] = None
                if len(s) > per_set:
                    s.popitem(last=False)
                if why is not None:
                    had = sized.get(line)
                    kind = 0 if had is None else (3 if taken else 1) + (size != 0 and had != size)
                    why[WHY[kind]] += 1
            if why is not None and size:
                sized[line] = size
    return mallocs, misses, len(pages)


def self_test():
    """The model on records whose answer is known; True if it gives it."""
    def record(blocks):
        fd, path = tempfile.mkstemp(prefix="keel-locality-test-")
        with os.fdopen(fd, "wb") as f:
            array.array("Q", [w for b in blocks for w in b]).tofile(f)
        return path
    # 16 blocks of 64 bytes, 16 lines, cycled 10 times through an 8 KiB cache: only the
    # first round misses; 256 lines (16 KiB) cycled through it: every access misses.
    small = record([(0x10000 + 64 * (i % 16), 64) for i in range(160)])
    large = record([(0x10000 + 64 * (i % 256), 64) for i in range(2560)])
    # A 4 KiB block touches three lines.
    wide = record([(0x20000, 4096)])
    # Four 64-byte blocks 8 KiB apart: a cache of two lines misses every time, one of
    # four only the first round, and four lines in two sets of two ways (all four in one
    # set) every time again.
    aliased = record([(0x40000 + 8192 * (i % 4), 64) for i in range(40)])
    # Two threads writing one line in turn: shared, one miss; each its own cache, every
    # write misses, the other thread's having taken the line away.
    pingpong = record([(0x30000, 64 | (i % 2) << 32) for i in range(10)])
    # A block one thread allocates and another frees, ten times over: the same, counting
    # the frees' writes (20); shared, one miss in all.
    handoff = record([(0x50000, (64 if i % 2 == 0 else 0) | (i % 2) << 32) for i in range(20)])
    # A line reused by a block of another size after the cache let it go: 201 cold misses
    # and one of its own, other size, in a 128-line cache.
    resized = record([(0x70000, 64)] + [(0x80000 + 64 * i, 64) for i in range(200)] + [(0x70000, 32)])
    # A block one thread gets back five times after freeing it: one cold miss, none passed.
    reused = record([(0x90000, 64 if i % 2 == 0 else 0) for i in range(10)])

    def kinds(path, cache, per_thread):
        why = collections.Counter()
        replay(path, cache, 0, per_thread, why)
        return tuple(why[k] for k in WHY + ("passed",))
    try:
        ok = (kinds(large, 8192, False) == (256, 2304, 0, 0, 0, 0) and
              kinds(resized, 8192, False) == (201, 0, 1, 0, 0, 0) and
              kinds(handoff, 8192, True) == (1, 0, 0, 19, 0, 9) and
              kinds(reused, 8192, True) == (1, 0, 0, 0, 0, 0) and
              replay(small, 8192, 0) == (160, 16, 1) and replay(large, 8192, 0) == (2560, 2560, 4) and
              replay(wide, 8192, 0) == (1, 3, 1) and replay(aliased, 128, 0) == (40, 40, 4) and
              replay(aliased, 256, 0) == (40, 4, 4) and replay(aliased, 256, 2) == (40, 40, 4) and
              replay(pingpong, 8192, 0) == (10, 1, 1) and replay(pingpong, 8192, 0, True) == (10, 10, 1) and
              replay(handoff, 8192, 0) == (10, 1, 1) and replay(handoff, 8192, 0, True) == (10, 20, 1))
    finally:
        for p in (small, large, wide, aliased, pingpong, handoff, resized, reused):
            os.unlink(p)
    print("locality.py: self-test %s" % ("passed" if ok else "FAILED"))
    return ok


def main(argv=None):
    ap = tool_parser(__doc__)
    ap.add_argument("--cache", type=int, default=0, help="bytes (default: this machine's L2)")
    ap.add_argument("--ways", type=int, default=0, help="0: fully associative (default)")
    ap.add_argument("--per-thread", action="store_true", help="a cache for each thread (threads on processors of their own)")
    ap.add_argument("--why", action="store_true",
                    help="the misses per 1,000 mallocs by kind, and the blocks passed between threads")
    ap.add_argument("--self-test", action="store_true", help="check the model on known records and exit")
    ap.add_argument("program", nargs=argparse.REMAINDER, help="-- PROGRAM [ARGS...]")
    args = ap.parse_args(argv)
    if args.self_test:
        return 0 if self_test() else 1
    prog = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not prog:
        ap.error("no program given (after --)")
    cache = args.cache or second_level_cache_bytes()
    try:
        allocs = resolve_present(args.allocators, os.path.abspath(args.build_dir))
    except SetupError as e:
        print("locality.py: %s" % e, file=sys.stderr)
        return 2
    print("%s: a %d KiB cache%s, %s, lines of %d bytes" %
          (" ".join(prog), cache >> 10, " for each thread" if args.per_thread else "",
           "fully associative" if args.ways == 0 else "%d-way" % args.ways, LINE))
    kinds = WHY[:3] + (WHY[3:] if args.per_thread else ()) + (("passed",) if args.per_thread else ())
    print("%-12s %12s %14s %10s" % ("allocator", "mallocs", "misses/1,000", "4K pages") +
          ("".join(" %*s" % (max(len(k), 6), k) for k in kinds) if args.why else ""))
    with tempfile.TemporaryDirectory(prefix="keel-locality-") as tmp:
        shim = build_shim(tmp)
        for a in allocs:
            trace = os.path.join(tmp, a.name + ".trace")
            preload = shim if a.lib is None else shim + " " + a.lib
            env = dict(os.environ, LD_PRELOAD=preload, LOCALITY_TRACE=trace, **a.env)
            r = subprocess.run(prog, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if r.returncode != 0 or not os.path.exists(trace):
                print("locality.py: %s under %s failed (exit %d): %s" %
                      (prog[0], a.name, r.returncode, r.stderr.strip()[-500:]), file=sys.stderr)
                return 1
            why = collections.Counter() if args.why else None
            n, misses, pages = replay(trace, cache, args.ways, args.per_thread, why)
            per = 1000.0 / n if n else 0.0
            print("%-12s %12d %14.1f %10d" % (a.name, n, misses * per, pages) +
                  ("".join(" %*.1f" % (max(len(k), 6), why[k] * per) for k in kinds) if args.why else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
