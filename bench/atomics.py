#!/usr/bin/env python3
"""atomics.py -- the atomic read-modify-writes an allocator executes per 1,000 malloc+free pairs.

Each one takes a cache line for its core alone; where the line is shared (a lock, a
list head, a counter every thread bumps) it is what stops an allocator from scaling
with cores, and on two cores it cannot be timed. So this counts them instead: each
threaded bench/ program runs under each allocator in valgrind's callgrind
(--dump-instr=yes), which counts how often every instruction ran; the allocator's
library is disassembled (objdump), and the executions of its instructions that lock a
line - lock-prefixed ones and xchg with memory, x86-64 - are added up, mfence apart.
Per program and allocator it prints locked read-modify-writes and fences per 1,000
malloc+free pairs (the pairs each program prints, as bench/locks.py reads them), and
with --where the functions they ran in.

Exact and repeatable, and the floor, not the cost: callgrind runs one thread at a time,
so no lock is ever found held and no compare-and-swap retries; a lock-prefixed
instruction on a line only its thread uses is counted like one on a line every thread
fights over. Under glibc the count is all of libc's (its stdio locks included), from
the allocator's functions only with --where. x86-64 only.

    python3 bench/atomics.py [--allocators glibc,mimalloc,keel] [--programs xthread,larson]
                             [--threads 2] [--scale 0.05] [--where] [--build-dir build]
    python3 bench/atomics.py --self-test
"""
import functools
import glob
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from locks import PAIRS  # noqa: E402  (pairs each program prints)
from run import PROGRAMS, SetupError, resolve_present, tool_parser  # noqa: E402

DEFAULT_PROGRAMS = "xthread,larson,prodcons,mpmc64,mpmcmix,workset"


def classify(disassembly):
    """{address: "rmw" | "fence"} from `objdump -d --no-show-raw-insn` text."""
    kinds = {}
    insn = re.compile(r"^\s*([0-9a-f]+):\s+(.*)$")
    for line in disassembly.splitlines():
        m = insn.match(line)
        if not m:
            continue
        text = m.group(2).strip()
        op = text.split()[0] if text else ""
        if op == "lock" or op.startswith("lock."):
            kinds[int(m.group(1), 16)] = "rmw"
        elif op.startswith("xchg") and "(" in text:  # xchg with memory locks implicitly
            kinds[int(m.group(1), 16)] = "rmw"
        elif op == "mfence":
            kinds[int(m.group(1), 16)] = "fence"
    return kinds


def parse_callgrind(path, obj_matches):
    """{(function, address): executions} of the objects obj_matches(name) accepts, from a
    callgrind file written with --dump-instr=yes --dump-line=no (positions: instr).
    Addresses are the object's own (callgrind subtracts where it was mapped)."""
    names = {"ob": {}, "fn": {}}
    kind_of = {"ob": "ob", "cob": "ob", "fn": "fn", "cfn": "fn"}
    ob = fn = None
    last = 0
    after_call = False
    counts = Counter()
    with open(path, errors="replace") as f:
        for line in f:
            c = line[:1]
            if c in "0123456789+-*":
                parts = line.split()
                tok = parts[0]
                if tok == "*":
                    addr = last
                elif tok[0] in "+-":
                    addr = last + int(tok, 0)
                else:
                    addr = int(tok, 0)
                last = addr
                if after_call:  # the call's inclusive cost, not this instruction's runs
                    after_call = False
                    continue
                if ob is not None and obj_matches(ob) and len(parts) > 1:
                    counts[(fn, addr)] += int(parts[1])
                continue
            key, sep, rest = line.partition("=")
            if not sep:
                continue
            if key == "calls":
                after_call = True
                continue
            space = kind_of.get(key)
            if space is None:
                continue
            rest = rest.strip()
            m = re.match(r"^\((\d+)\)(?:\s+(.*))?$", rest)
            if m:
                if m.group(2) is not None:
                    names[space][m.group(1)] = m.group(2)
                name = names[space].get(m.group(1), rest)
            else:
                name = rest
            if key == "ob":
                ob = name
            elif key == "fn":
                fn = name
    return counts


def count(counts, kinds):
    """(rmw, fences, {function: rmw}) from parse_callgrind's counts and classify's kinds."""
    rmw = fences = 0
    by_fn = Counter()
    for (fn, addr), n in counts.items():
        k = kinds.get(addr)
        if k == "rmw":
            rmw += n
            by_fn[fn] += n
        elif k == "fence":
            fences += n
    return rmw, fences, by_fn


@functools.lru_cache(maxsize=None)
def kinds_of(library):
    """classify() of a library's disassembly, once per library."""
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", library], capture_output=True, text=True,
                         check=True).stdout
    return classify(dis)


def libc_path():
    out = subprocess.run(["ldd", "/bin/true"], capture_output=True, text=True).stdout
    m = re.search(r"libc\.so\.6 => (\S+)", out)
    return os.path.realpath(m.group(1)) if m else None


def measure(prog, args, lib, tmp, env_extra):
    """(pairs, rmw, fences, by_fn) of one run of prog under lib (None: glibc)."""
    target = os.path.realpath(lib) if lib else libc_path()
    for old in glob.glob(os.path.join(tmp, "cg.*")):
        os.unlink(old)
    env = dict(os.environ, **env_extra)
    if lib:
        env["LD_PRELOAD"] = lib
    cmd = ["valgrind", "--tool=callgrind", "--dump-instr=yes", "--dump-line=no",
           "--callgrind-out-file=" + os.path.join(tmp, "cg.%p"), prog] + args
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s failed under callgrind (exit %d): %s" % (prog, r.returncode, r.stderr[-400:]))
    name = os.path.basename(prog)
    pairs = PAIRS[name](r.stdout)
    kinds = kinds_of(target)
    counts = Counter()
    for path in glob.glob(os.path.join(tmp, "cg.*")):
        counts.update(parse_callgrind(path, lambda ob: os.path.realpath(ob) == target))
    rmw, fences, by_fn = count(counts, kinds)
    return pairs, rmw, fences, by_fn


# A glibc function is the allocator's if its name says so (for --where under glibc).
GLIBC_MALLOC = re.compile(r"malloc|free|calloc|realloc|memalign|tcache|arena|_int_|sysmalloc|heap")


def self_test():
    """The parser and the classifier on inputs whose answer is known."""
    dis = """
0000000000001000 <f>:
    1000:\tlock cmpxchg %rdx,(%rdi)
    1005:\tmov    (%rdi),%rax
    1008:\txchg   %eax,(%rdx)
    100a:\txchg   %ax,%ax
    100c:\tmfence
    100f:\tlock xadd %eax,0x8(%rdi)
    1014:\tret
"""
    kinds = classify(dis)
    ok = kinds == {0x1000: "rmw", 0x1008: "rmw", 0x100c: "fence", 0x100f: "rmw"}
    text = """# callgrind format
version: 1
positions: instr
events: Ir
summary: 100

ob=(1) /lib/alloc.so
fl=(1) ???
fn=(1) f
0x1000 5
+5 5
+3 4
cob=(2) /lib/other.so
cfn=(2) g
calls=4 0x9000
* 40
+4 4
+3 6
fn=(3) h
0x100f 2
ob=(2)
fn=(2)
0x1000 99
ob=(1)
fn=(1)
0x1000 1
"""
    with tempfile.NamedTemporaryFile("w", suffix=".cg", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        counts = parse_callgrind(path, lambda ob: ob == "/lib/alloc.so")
    finally:
        os.unlink(path)
    want = {("f", 0x1000): 6, ("f", 0x1005): 5, ("f", 0x1008): 4, ("f", 0x100c): 4,
            ("f", 0x100f): 6, ("h", 0x100f): 2}
    ok = ok and dict(counts) == want
    rmw, fences, by_fn = count(counts, kinds)
    # 0x1000: 6, 0x1008: 4 (the call line after calls= is skipped), 0x100f: 6 + 2
    ok = ok and (rmw, fences, dict(by_fn)) == (18, 4, {"f": 16, "h": 2})
    print("atomics.py: self-test %s" % ("passed" if ok else "FAILED"))
    return ok


def main(argv=None):
    ap = tool_parser(__doc__)
    ap.add_argument("--programs", default=DEFAULT_PROGRAMS, help="default: %(default)s")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--scale", default="0.05", help="work multiplier (callgrind is ~50x slower)")
    ap.add_argument("--env", action="append", default=[], metavar="VAR=VALUE",
                    help="set in every run's environment (KEEL_CPUS=16: Keel's many-core policies)")
    ap.add_argument("--where", action="store_true", help="the functions the read-modify-writes ran in")
    ap.add_argument("--max", type=float, default=None,
                    help="a check: exit 1 if any program takes more locked read-modify-writes per "
                         "1,000 pairs than this under any allocator asked for")
    ap.add_argument("--self-test", action="store_true", help="check the parser and classifier and exit")
    args = ap.parse_args(argv)
    if args.self_test:
        return 0 if self_test() else 1
    build = os.path.abspath(args.build_dir)
    try:
        allocs = resolve_present(args.allocators, build)
    except SetupError as e:
        print("atomics.py: %s" % e, file=sys.stderr)
        return 2
    env_extra = dict(e.split("=", 1) for e in args.env)
    programs = [p.strip() for p in args.programs.split(",") if p.strip()]
    unknown = [p for p in programs if p not in PAIRS or p not in PROGRAMS]
    if unknown:
        print("atomics.py: no pair count for %s (known: %s)" % (",".join(unknown), ",".join(PAIRS)), file=sys.stderr)
        return 2
    print("locked read-modify-writes (and mfences) per 1,000 malloc+free pairs, %d threads, scale %s%s;"
          " callgrind, one thread at a time" % (args.threads, args.scale,
                                                "".join(", " + e for e in args.env)))
    print("%-10s" % "program" + "".join("%18s" % a.name for a in allocs))
    over = False
    where = defaultdict(Counter)
    with tempfile.TemporaryDirectory(prefix="keel-atomics-") as tmp:
        for prog in programs:
            path = os.path.join(build, "bench", prog)
            argv = [args.scale] + ([str(args.threads)] if PROGRAMS[prog][1] else [])
            cells = []
            for a in allocs:
                try:
                    pairs, rmw, fences, by_fn = measure(path, argv, a.lib, tmp, dict(env_extra, **a.env))
                except (RuntimeError, subprocess.CalledProcessError, AttributeError) as e:
                    print("atomics.py: %s under %s: %s" % (prog, a.name, e), file=sys.stderr)
                    return 1
                if a.lib is None:  # all of libc: the allocator's functions are the ones named so
                    rmw = sum(n for fn, n in by_fn.items() if fn and GLIBC_MALLOC.search(fn))
                per = 1000.0 * rmw / pairs if pairs else 0.0
                over |= args.max is not None and per > args.max
                cells.append("%11.1f (%4.1f)" % (per, 1000.0 * fences / pairs if pairs else 0.0))
                for fn, n in by_fn.items():
                    where[(prog, a.name)][fn] += n
            print("%-10s" % prog + "".join("%18s" % c for c in cells))
    if args.where:
        for (prog, name), fns in where.items():
            top = ", ".join("%s %d" % (fn, n) for fn, n in fns.most_common(6))
            print("  %s under %s: %s" % (prog, name, top or "none"))
    if over:
        print("atomics.py: above %g per 1,000 pairs" % args.max)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
