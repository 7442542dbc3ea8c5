#!/usr/bin/env python3
"""Run libkeel's benchmark programs under several allocators and compare them.

Each program is run under each allocator (LD_PRELOAD; glibc = no preload) --runs times.
Within a round every allocator runs each program once, in an order that rotates from
round to round (round 1: A B C D E, round 2: B C D E A, ...), so slow drifts in machine
load are spread over all allocators. For every run the wall time, the CPU time and the
peak RSS of the program (exact, read by the measure launcher every millisecond and as
the program exits; ru_maxrss, which Linux only approximates, is kept beside it in the
JSON) are recorded and its checksum line is
checked: a program must print the same checksum under every allocator and in every run.

The table shows medians per allocator and the ratios of the baseline allocator (keel
by default) to each of the others, with geometric means. Exit status: 0 if every run
succeeded and all checksums agree, 1 if a program failed or checksums differ, 2 for
usage or setup errors.

Only the Python standard library is used (Python >= 3.9).
"""

import argparse
import datetime
import fcntl
import hashlib
import json
import math
import os
import platform
import re
import select
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(HERE)


def read_programs(path=os.path.join(HERE, "programs.txt")):
    """name -> (one-line description, takes a thread-count argument), in run order, from
    bench/programs.txt (the list CMakeLists.txt builds and the lab's micro suite runs)."""
    with open(path) as f:
        rows = [line.split(None, 2) for line in f if line.strip() and not line.startswith("#")]
    return {name: (desc.strip(), threads == "yes") for name, threads, desc in rows}


PROGRAMS = read_programs()

# name -> (library file in the multiarch directory, Debian package)
SYSTEM_ALLOCATORS = {
    "jemalloc": ("libjemalloc.so.2", "libjemalloc2"),
    "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc-minimal4"),
    "mimalloc": ("libmimalloc.so.2", "libmimalloc2.0"),
}
DEFAULT_ALLOCATORS = "glibc,jemalloc,tcmalloc,mimalloc,keel"
CHECKSUM_RE = re.compile(r"\bchecksum=([0-9a-fA-F]+)\b")
NOISY_SPREAD = 0.10  # (max - min) / median above which a median is flagged


class SetupError(Exception):
    pass


def eprint(*a, **kw):
    print(*a, file=sys.stderr, **kw)


def multiarch_libdir():
    """/usr/lib/<multiarch>, from `gcc -print-multiarch`, else Python's own idea."""
    triplet = ""
    try:
        triplet = subprocess.run(["gcc", "-print-multiarch"], capture_output=True, text=True,
                                 timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    if not triplet:
        triplet = sysconfig.get_config_var("MULTIARCH") or ""
    if not triplet:
        triplet = platform.machine() + "-linux-gnu"
    return os.path.join("/usr/lib", triplet)


class Allocator:
    def __init__(self, name, lib, problem=None, package=None, env=None):
        self.name = name
        self.lib = lib          # path for LD_PRELOAD, None for glibc
        self.problem = problem  # why it cannot be used, or None
        self.package = package
        self.env = env or {}    # set for the program besides LD_PRELOAD (NAME=lib@VAR=VALUE)

    def fingerprint(self):
        """(real path, size, mtime) of the library, to notice a rebuild during a run."""
        if self.lib is None:
            return None
        real = os.path.realpath(self.lib)
        try:
            st = os.stat(real)
            return (real, st.st_size, st.st_mtime_ns)
        except OSError:
            return (real, None, None)

    def sha256(self):
        if self.lib is None:
            return None
        try:
            with open(self.lib, "rb") as f:
                return hashlib.sha256(f.read()).hexdigest()
        except OSError:
            return None

    def describe(self):
        if self.lib is None:
            return "glibc " + (os.confstr("CS_GNU_LIBC_VERSION") or "").replace("glibc ", "")
        real = os.path.realpath(self.lib)
        env = "".join(" %s=%s" % kv for kv in sorted(self.env.items()))
        return (self.lib if real == self.lib else "%s -> %s" % (self.lib, os.path.basename(real))) + env


def resolve_allocators(spec, build_dir):
    libdir = multiarch_libdir()
    out = []
    for item in [s.strip() for s in spec.split(",") if s.strip()]:
        if "=" in item:  # custom: name=/path/to/lib.so, then @VAR=VALUE for each setting
            name, rest = item.split("=", 1)
            path, *settings = rest.split("@")
            env = {}
            for s in settings:
                var, eq, value = s.partition("=")
                if not eq or not var:
                    raise SetupError("%s: '@%s' is not VAR=VALUE" % (name, s))
                env[var] = value
            path = os.path.abspath(path)
            problem = None if os.path.isfile(path) else "%s: %s not found" % (name, path)
            out.append(Allocator(name, path, problem, env=env))
        elif item == "glibc":
            out.append(Allocator("glibc", None))
        elif item == "keel":
            path = os.path.join(build_dir, "libkeel.so")
            problem = None
            if not os.path.isfile(path):
                problem = ("keel: %s not found. Build it with:\n"
                           "    cmake -S %s -B %s -G Ninja && cmake --build %s"
                           % (path, SOURCE_DIR, build_dir, build_dir))
            out.append(Allocator("keel", path, problem))
        elif item in SYSTEM_ALLOCATORS:
            fname, pkg = SYSTEM_ALLOCATORS[item]
            path = os.path.join(libdir, fname)
            problem = None
            if not os.path.isfile(path):
                problem = ("%s: %s not found. Install the Debian package %s:\n"
                           "    sudo apt-get install %s" % (item, path, pkg, pkg))
            out.append(Allocator(item, path, problem, pkg))
        else:
            raise SetupError("unknown allocator '%s' (known: %s, or NAME=/path/to/lib.so)"
                             % (item, DEFAULT_ALLOCATORS))
    names = [a.name for a in out]
    if len(set(names)) != len(names):
        raise SetupError("an allocator is listed twice: %s" % ",".join(names))
    return out


def resolve_present(spec, build_dir):
    """resolve_allocators, every library present: else a SetupError naming what is missing
    and how to get it (bench/'s other tools)."""
    allocs = resolve_allocators(spec, build_dir)
    missing = [a.problem for a in allocs if a.problem]
    if missing:
        raise SetupError("\n".join(missing))
    return allocs


def tool_parser(doc):
    """The argument parser of bench/'s other tools: the first line of their doc string,
    --allocators as here, and --build-dir."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--allocators", default=DEFAULT_ALLOCATORS,
                    help="as run.py's: names or NAME=/path/to/lib.so (default: %(default)s)")
    ap.add_argument("--build-dir", default=os.path.join(SOURCE_DIR, "build"))
    return ap


def package_version(pkg):
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True,
                           text=True, timeout=20)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# ---------------------------------------------------------------------------------
# running one program


def kill_group(pid):
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def wait_with_timeout(pid, timeout):
    """os.wait4(pid) with a timeout; on timeout the process group is killed.
    Returns (status, rusage, timed_out). The child runs in its own session (so that it
    can be killed with everything it started): on Ctrl-C it is killed here."""
    try:
        return _wait_with_timeout(pid, timeout)
    except BaseException:
        kill_group(pid)
        os.wait4(pid, 0)
        raise


def _wait_with_timeout(pid, timeout):
    timed_out = False
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            ready, _, _ = select.select([fd], [], [], timeout)
            timed_out = not ready
        finally:
            os.close(fd)
    else:
        deadline = time.monotonic() + timeout
        delay = 0.0002
        while True:
            wpid, status, ru = os.wait4(pid, os.WNOHANG)
            if wpid:
                return status, ru, False
            if time.monotonic() >= deadline:
                timed_out = True
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
    if timed_out:
        kill_group(pid)
    _, status, ru = os.wait4(pid, 0)
    return status, ru, timed_out


def describe_exit(code):
    if code >= 0:
        return "exit status %d" % code
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = "signal %d" % -code
    return "killed by %s" % name


def tail(text, lines=12):
    t = text.strip().splitlines()
    return "\n".join(("    " + line) for line in t[-lines:])


def run_once(prog_path, prog_args, alloc, measure, timeout, tmpdir, checksum=True):
    """Runs one program under one allocator. Returns a result dict (ok=True/False). With
    checksum, its output must hold one 'checksum=' (bench/ programs); without, the caller
    checks it (bench/public.py)."""
    env = dict(os.environ, **alloc.env)
    env.pop("LD_PRELOAD", None)
    out_path = os.path.join(tmpdir, "stdout")
    err_path = os.path.join(tmpdir, "stderr")
    rep_path = os.path.join(tmpdir, "report")
    if os.path.exists(rep_path):
        os.unlink(rep_path)
    if measure:
        argv = [measure, rep_path, alloc.lib or "-", prog_path] + prog_args
    else:
        argv = [prog_path] + prog_args
        if alloc.lib:
            env["LD_PRELOAD"] = alloc.lib
    with open(out_path, "wb") as out_f, open(err_path, "wb") as err_f:
        t0 = time.perf_counter()
        pid = os.posix_spawn(argv[0], argv, env, setsid=True, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, out_f.fileno(), 1),
            (os.POSIX_SPAWN_DUP2, err_f.fileno(), 2),
        ])
        status, ru, timed_out = wait_with_timeout(pid, timeout)
        wall = time.perf_counter() - t0
    with open(out_path, "rb") as f:
        stdout = f.read().decode("utf-8", "replace")
    with open(err_path, "rb") as f:
        stderr = f.read().decode("utf-8", "replace")

    res = {"ok": False, "error": None, "stdout": stdout.strip(),
           "stderr": stderr.strip()[-4000:] or None}
    if measure:
        code = os.waitstatus_to_exitcode(status)
        if timed_out or code != 0 or not os.path.exists(rep_path):
            why = ("timed out after %g s (killed)" % timeout) if timed_out else \
                "the measure launcher failed (%s)" % describe_exit(code)
            res["error"] = why + ("\n" + tail(stderr) if stderr.strip() else "")
            return res
        with open(rep_path) as f:
            fields = dict(kv.split("=", 1) for kv in f.read().split())
        status = int(fields["status"])
        res.update(wall_s=int(fields["wall_ns"]) / 1e9,
                   maxrss_kib=int(fields["maxrss_kib"]),
                   peak_kib=int(fields.get("peak_kib", fields["maxrss_kib"])),
                   utime_s=int(fields["utime_us"]) / 1e6,
                   stime_s=int(fields["stime_us"]) / 1e6,
                   minflt=int(fields["minflt"]), majflt=int(fields["majflt"]),
                   nvcsw=int(fields["nvcsw"]), nivcsw=int(fields["nivcsw"]))
    else:
        if timed_out:
            res["error"] = "timed out after %g s (killed)" % timeout
            return res
        res.update(wall_s=wall, maxrss_kib=ru.ru_maxrss, peak_kib=ru.ru_maxrss, utime_s=ru.ru_utime,
                   stime_s=ru.ru_stime, minflt=ru.ru_minflt, majflt=ru.ru_majflt,
                   nvcsw=ru.ru_nvcsw, nivcsw=ru.ru_nivcsw)
    res["cpu_s"] = res["utime_s"] + res["stime_s"]
    code = os.waitstatus_to_exitcode(status)
    res["exit"] = code
    if "cannot be preloaded" in stderr:
        res["error"] = "the dynamic loader could not preload %s:\n%s" % (alloc.lib, tail(stderr))
        return res
    if code != 0:
        res["error"] = describe_exit(code) + ("\n" + tail(stderr) if stderr.strip() else "")
        return res
    if not checksum:
        res["ok"] = True
        return res
    sums = CHECKSUM_RE.findall(stdout)
    if len(sums) != 1:
        res["error"] = "expected one 'checksum=' in the output, got %d:\n%s" % (
            len(sums), tail(stdout + "\n" + stderr))
        return res
    res["checksum"] = sums[0].lower()
    res["ok"] = True
    return res


# ---------------------------------------------------------------------------------
# statistics and tables


def geomean(values):
    values = [v for v in values if v is not None and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def spread(values):
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med > 0 else 0.0


def render_table(title, programs, allocs, baseline, cell, fmt, note_noisy):
    """cell(prog, alloc) -> (median or None, list of values or None, failed flag)."""
    others = [a for a in allocs if a != baseline]
    ratio_hdr = ["%s/%s" % (baseline, o) for o in others]
    header = ["program"] + allocs + ratio_hdr
    rows, noisy_seen = [], False
    meds = {a: [] for a in allocs}        # medians of programs where all allocators succeeded
    ratios = {o: [] for o in others}
    for prog in programs:
        cells = {a: cell(prog, a) for a in allocs}
        row = [prog]
        for a in allocs:
            med, vals, failed = cells[a]
            if failed:
                row.append("FAIL")
            elif med is None:
                row.append("-")
            else:
                mark = ""
                if note_noisy and vals and spread(vals) > NOISY_SPREAD:
                    mark, noisy_seen = "*", True
                row.append(fmt(med) + mark)
        complete = all(cells[a][0] is not None for a in allocs)
        base = cells[baseline][0]
        for o in others:
            other = cells[o][0]
            if base is not None and other is not None and other > 0:
                r = base / other
                row.append("%.2f" % r)
                ratios[o].append(r)
            else:
                row.append("-")
        if complete:
            for a in allocs:
                meds[a].append(cells[a][0])
        rows.append(row)
    gm = ["geomean"]
    for a in allocs:
        g = geomean(meds[a])
        gm.append(fmt(g) if g is not None else "-")
    for o in others:
        g = geomean(ratios[o])
        gm.append("%.2f" % g if g is not None else "-")
    rows.append(gm)

    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    lines = [title]
    sep_at = 1 + len(allocs)

    def fmt_row(r):
        parts = []
        for i, v in enumerate(r):
            s = str(v).ljust(widths[i]) if i == 0 else str(v).rjust(widths[i])
            if i == sep_at:
                parts.append("|")
            parts.append(s)
        return "  ".join(parts).rstrip()

    lines.append(fmt_row(header))
    lines.append("-" * len(fmt_row(header)))
    for r in rows[:-1]:
        lines.append(fmt_row(r))
    lines.append("-" * len(fmt_row(header)))
    lines.append(fmt_row(rows[-1]))
    n_complete = len(next(iter(meds.values()))) if meds else 0
    if n_complete < len(programs):
        lines.append("(geomeans: of the medians, over the %d program(s) that succeeded under every "
                     "allocator; of a ratio, over the programs where both allocators succeeded: %s)"
                     % (n_complete, ", ".join("%s %d" % (o, len(ratios[o])) for o in others)))
    return "\n".join(lines), noisy_seen, {o: geomean(ratios[o]) for o in others}


# ---------------------------------------------------------------------------------


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="Run libkeel's benchmarks under several allocators (via LD_PRELOAD) "
                    "and compare wall time, CPU time and peak RSS.",
        epilog="Programs: " + ", ".join(PROGRAMS) + ". See bench/README.md.")
    ap.add_argument("--build-dir", default="./build",
                    help="CMake build directory: libkeel.so is taken from here and the "
                         "programs from <build-dir>/bench (default: ./build)")
    ap.add_argument("--bench-dir", help="directory of the benchmark binaries "
                                        "(default: <build-dir>/bench)")
    ap.add_argument("--allocators", default=None,
                    help="comma-separated list from glibc,jemalloc,tcmalloc,mimalloc,keel, "
                         "or NAME=/path/to/lib.so[@VAR=VALUE...], the settings in the "
                         "program's environment (default: %s; missing ones are then "
                         "skipped with a warning, while a missing allocator that was asked "
                         "for explicitly is an error)" % DEFAULT_ALLOCATORS)
    ap.add_argument("--runs", type=int, default=3, help="runs per program and allocator (default 3)")
    ap.add_argument("--programs", default=None,
                    help="comma-separated subset of the programs (default: all)")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="work multiplier passed to every program (default 1: ~0.3-2 s each)")
    ap.add_argument("--threads", type=int, default=None,
                    help="thread count for the threaded programs (default: each program's own)")
    ap.add_argument("--baseline", default=None,
                    help="allocator the ratios are computed for (default: keel if selected, "
                         "else the first allocator)")
    ap.add_argument("--json", metavar="OUT", help="write all results to this JSON file")
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="seconds before a run is killed and counted as failed (default 120)")
    ap.add_argument("--warmup", type=int, default=0,
                    help="extra rounds run first and discarded (default 0)")
    ap.add_argument("--skip-missing", action="store_true",
                    help="skip allocators whose library is missing even if asked for explicitly")
    ap.add_argument("--no-lock", action="store_true",
                    help="do not wait for other run.py instances on this machine to finish")
    ap.add_argument("--list", action="store_true", help="list programs and allocators and exit")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if not args.scale > 0:
        ap.error("--scale must be > 0")
    if args.threads is not None and args.threads < 1:
        ap.error("--threads must be at least 1")
    return args


def acquire_lock():
    """One benchmark run at a time per machine: concurrent runs would distort each other."""
    path = os.path.join(tempfile.gettempdir(), "keel-bench.lock")
    try:
        f = open(path, "a+")
    except OSError as e:
        eprint("run.py: warning: cannot open the lock file %s (%s); not checking for other runs"
               % (path, e))
        return None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip()
        eprint("run.py: another benchmark run is in progress (%s); waiting for it to finish..."
               % (holder or path))
        fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    f.truncate()
    f.write("pid %d since %s" % (os.getpid(), datetime.datetime.now().strftime("%H:%M:%S")))
    f.flush()
    return f


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    build_dir = os.path.abspath(args.build_dir)
    bench_dir = os.path.abspath(args.bench_dir or os.path.join(build_dir, "bench"))

    explicit = args.allocators is not None
    try:
        allocs = resolve_allocators(args.allocators or DEFAULT_ALLOCATORS, build_dir)
    except SetupError as e:
        eprint("run.py: error:", e)
        return 2

    if args.programs:
        programs = [p.strip() for p in args.programs.split(",") if p.strip()]
        unknown = [p for p in programs if p not in PROGRAMS]
        if unknown:
            eprint("run.py: error: unknown program(s) %s (known: %s)"
                   % (", ".join(unknown), ", ".join(PROGRAMS)))
            return 2
    else:
        programs = list(PROGRAMS)

    if args.list:
        print("programs (in %s):" % bench_dir)
        for p, (desc, thr) in PROGRAMS.items():
            there = "" if os.path.isfile(os.path.join(bench_dir, p)) else "   [not built]"
            print("  %-12s %s%s%s" % (p, desc, " [threads]" if thr else "", there))
        print("allocators:")
        for a in allocs:
            print("  %-12s %s" % (a.name, a.describe() if not a.problem else
                                  "MISSING -- " + a.problem.split(":", 1)[1].strip()))
        return 0

    # allocators: missing libraries
    missing = [a for a in allocs if a.problem]
    for a in missing:
        if explicit and not args.skip_missing:
            eprint("run.py: error: " + a.problem)
        else:
            eprint("run.py: warning: skipping " + a.problem)
    if missing and explicit and not args.skip_missing:
        eprint("run.py: (use --skip-missing to run without the missing allocators)")
        return 2
    allocs = [a for a in allocs if not a.problem]
    if not allocs:
        eprint("run.py: error: no usable allocator")
        return 2
    names = [a.name for a in allocs]
    baseline = args.baseline or ("keel" if "keel" in names else names[0])
    if baseline not in names:
        eprint("run.py: error: baseline '%s' is not among the allocators run (%s)"
               % (baseline, ",".join(names)))
        return 2

    # programs and launcher
    absent = [p for p in programs if not os.access(os.path.join(bench_dir, p), os.X_OK)]
    if absent:
        eprint("run.py: error: benchmark program(s) not built in %s: %s\n"
               "Build them with the project:\n"
               "    cmake -S %s -B %s -G Ninja && cmake --build %s --target keel_bench\n"
               "or on their own:\n"
               "    cmake -S %s -B BUILD_BENCH -G Ninja && cmake --build BUILD_BENCH  "
               "(then --bench-dir BUILD_BENCH)"
               % (bench_dir, ", ".join(absent), SOURCE_DIR, build_dir, build_dir, HERE))
        return 2
    measure = os.path.join(bench_dir, "measure")
    if not os.access(measure, os.X_OK):
        measure = None
        eprint("run.py: warning: %s/measure not built: measuring the programs directly, so each "
               "peak RSS includes the 10-20 MiB that Linux carries over from this Python process "
               "through fork+exec" % bench_dir)

    lock = None if args.no_lock else acquire_lock()

    prog_args = {}
    for p in programs:
        a = []
        if args.scale != 1.0 or (args.threads and PROGRAMS[p][1]):
            a.append(repr(args.scale) if args.scale != int(args.scale) else str(int(args.scale)))
        if args.threads and PROGRAMS[p][1]:
            a.append(str(args.threads))
        prog_args[p] = a

    load_start = os.getloadavg()
    if not args.quiet:
        eprint("run.py: %d program(s) x %d allocator(s) x %d run(s)%s; load average %.2f"
               % (len(programs), len(allocs), args.runs,
                  " + %d warm-up round(s)" % args.warmup if args.warmup else "", load_start[0]))
        if load_start[0] > 0.5 * (os.cpu_count() or 1):
            eprint("run.py: note: the machine is busy (load %.2f on %d CPUs): wall times will be "
                   "noisy; compare the CPU-time table too" % (load_start[0], os.cpu_count() or 1))

    results = {p: {a.name: [] for a in allocs} for p in programs}
    fingerprints = {a.name: a.fingerprint() for a in allocs}
    hashes = {a.name: a.sha256() for a in allocs}
    started = datetime.datetime.now()
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="keel-bench-") as tmpdir:
        try:
            total_rounds = args.warmup + args.runs
            for rnd in range(total_rounds):
                warm = rnd < args.warmup
                k = rnd % len(allocs)
                order = allocs[k:] + allocs[:k]
                for p in programs:
                    if not args.quiet:
                        label = "warm-up" if warm else "round %d/%d" % (rnd - args.warmup + 1, args.runs)
                        eprint("[%s] %-12s" % (label, p), end="", flush=True)
                    for a in order:
                        r = run_once(os.path.join(bench_dir, p), prog_args[p], a, measure,
                                     args.timeout, tmpdir)
                        r["round"] = rnd - args.warmup + 1
                        r["position"] = order.index(a) + 1
                        if not warm:
                            results[p][a.name].append(r)
                        if not args.quiet:
                            if r["ok"]:
                                eprint(" %s %.2fs %.0fM" % (a.name, r["wall_s"], r["maxrss_kib"] / 1024),
                                       end="", flush=True)
                            else:
                                eprint(" %s FAILED" % a.name, end="", flush=True)
                    if not args.quiet:
                        eprint()
        except KeyboardInterrupt:
            eprint("\nrun.py: interrupted")
            return 130
    elapsed = time.monotonic() - t_start
    load_end = os.getloadavg()
    if lock:
        lock.close()

    # ---- verification ----
    problems = []
    for a in allocs:
        if a.fingerprint() != fingerprints[a.name]:
            problems.append("%s: %s changed during the run (rebuilt?): the results mix versions"
                            % (a.name, a.lib))
    checksums = {}  # program -> the checksum (the majority one if they differ)
    suspect = set()  # (program, allocator) pairs whose checksum is not the majority one
    for p in programs:
        seen = {}
        for a in names:
            for r in results[p][a]:
                if not r["ok"]:
                    problems.append("%s under %s, round %d: %s" % (p, a, r["round"], r["error"]))
                else:
                    seen.setdefault(r["checksum"], set()).add(a)
        if len(seen) > 1:
            majority = max(seen, key=lambda c: len(seen[c]))
            desc = "; ".join("%s: %s" % (c, ",".join(sorted(seen[c], key=names.index)))
                             for c in sorted(seen, key=lambda c: -len(seen[c])))
            odd = sorted({a for c in seen if c != majority for a in seen[c]}, key=names.index)
            problems.append("%s: CHECKSUM MISMATCH between allocators (%s) -- suspect: %s"
                            % (p, desc, ",".join(odd)))
            checksums[p] = majority
            suspect.update((p, a) for a in odd)
        else:
            checksums[p] = next(iter(seen)) if seen else None

    # ---- tables ----
    def stat(prog, alloc, key):
        runs = results[prog][alloc]
        if not runs:
            return None, None, False
        if not all(r["ok"] for r in runs) or (prog, alloc) in suspect:
            return None, None, True
        vals = [r[key] for r in runs]
        return statistics.median(vals), vals, False

    sys_info = "%s, %d CPUs, Linux %s" % (cpu_model(), os.cpu_count() or 0, platform.release())
    print("libkeel benchmarks -- %s" % started.strftime("%Y-%m-%d %H:%M"))
    print("host: %s; load average %.2f at start, %.2f at end; %.0f s in all"
          % (sys_info, load_start[0], load_end[0], elapsed))
    print("%d run%s per program and allocator (the tables show medians), allocators alternated "
          "in an order rotating each round; scale %g%s"
          % (args.runs, "" if args.runs == 1 else "s", args.scale,
             "; %d threads" % args.threads if args.threads else ""))
    print("allocators: " + "; ".join("%s = %s" % (a.name, a.describe()) for a in allocs))
    print("ratios: %s / other (below 1: %s uses less)" % (baseline, baseline))
    print()
    tables = [
        ("Wall time (s), median of %d" % args.runs, "wall_s", lambda v: "%.3f" % v),
        ("Peak RSS (MiB, exact: read every ms and at exit), median of %d" % args.runs, "peak_kib",
         lambda v: "%.1f" % (v / 1024)),
        ("CPU time, user+sys (s), median of %d" % args.runs, "cpu_s", lambda v: "%.3f" % v),
    ]
    any_noisy = False
    summary = {}
    for title, key, fmt in tables:
        text, noisy, gms = render_table(title, programs, names, baseline,
                                        lambda p, a, key=key: stat(p, a, key), fmt,
                                        note_noisy=args.runs > 1)
        any_noisy |= noisy
        summary[key] = {"geomean_ratio_%s_over" % baseline: gms}
        print(text)
        print()
    if any_noisy:
        print("* the runs of this median differ by more than %d%% ((max-min)/median)"
              % round(NOISY_SPREAD * 100))
    if problems:
        print("PROBLEMS (%d):" % len(problems))
        for pr in problems:
            print("  - " + pr)
    else:
        print("All %d runs succeeded; every program printed the same checksum under every allocator."
              % (len(programs) * len(names) * args.runs))

    if args.json:
        doc = {
            "started": started.isoformat(timespec="seconds"),
            "elapsed_s": round(elapsed, 3),
            "host": {"cpu": cpu_model(), "cpus": os.cpu_count(), "kernel": platform.release(),
                     "load_start": load_start, "load_end": load_end},
            "runs": args.runs, "warmup": args.warmup, "scale": args.scale,
            "threads": args.threads, "baseline": baseline,
            "rss_method": "measure launcher: /proc/PID/statm every ms and at exit (peak_kib); "
                          "wait4's ru_maxrss (maxrss_kib)" if measure else
                          "os.wait4 from run.py (includes the Python process's RSS)",
            "allocators": {a.name: {"lib": a.lib, "real": os.path.realpath(a.lib) if a.lib else None,
                                    "env": a.env, "package": a.package, "sha256": hashes[a.name],
                                    "version": package_version(a.package) if a.package else
                                    (os.confstr("CS_GNU_LIBC_VERSION") if a.lib is None else None)}
                           for a in allocs},
            "programs": {},
            "summary": summary,
            "problems": problems,
        }
        for p in programs:
            entry = {"args": prog_args[p], "checksum": checksums[p],
                     "checksum_suspects": sorted(a for (q, a) in suspect if q == p),
                     "allocators": {}}
            for a in names:
                runs = results[p][a]
                ok = [r for r in runs if r["ok"]]
                e = {"runs": runs}
                if ok and len(ok) == len(runs) and (p, a) not in suspect:
                    for key in ("wall_s", "cpu_s", "peak_kib", "maxrss_kib"):
                        e["median_" + key] = statistics.median(r[key] for r in ok)
                entry["allocators"][a] = e
            doc["programs"][p] = entry
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        print("results written to %s" % args.json)
    return 1 if problems else 0


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


if __name__ == "__main__":
    sys.exit(main())
