"""threads: memory an allocator keeps per thread (servers with thousands of threads).

For each N in 1, 4, 16, 64, 256, 1024, 4096 (quick: up to 1024) a fresh process
(native/threads_park.c, compiled with cc on first use into ~/.cache/keel-lab) first
makes the same small allocations in main and reports its baseline RSS; then N threads
each allocate a little (24 blocks of 16 B - 4 KiB, about 14 KiB left live after a
third is freed again; BLOCKS option) and park. With all N parked, VmRSS is read from
/proc/PID/status:

    RSS per thread = (RSS with N parked - baseline RSS) / N

It includes each thread's touched stack pages and kernel-visible thread overhead,
which are the same under every allocator; the differences are the allocator's
per-thread caches and arenas. Threads get 256 KiB stacks (STACK_KIB option). With
blocks=0 the threads allocate nothing themselves (glibc's thread start still calls
calloc): the floor a thread costs; blocks=1 is one block per thread (16 B to 4 KiB by
thread, 900 B on average, a third of the threads freeing theirs again).

With work=W each thread first works before it allocates its blocks and parks: it
allocates and frees W blocks of 16 B - 1 KiB (random sizes), one at a time, or with
work_burst=1 all W and then all of them freed - a pooled connection thread that ran a
query and now waits for its next client. What its allocator keeps for it then shows
(free blocks in its cache, arenas).

Metrics: "rss_per_thread_kib" (at the largest N), "rss_peak_kib" (RSS with the largest
N parked), "start_ms" (time for the largest N to start, allocate and park), and per N
"n<N>.rss_per_thread_kib"; "points" has the whole sweep (x = threads).
Options: counts=1,16,256  stack_kib=256  blocks=24 (0-24)  work=0  work_burst=0 (0/1)
settle_ms=150 (wait before reading RSS).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from ..procfs import rss_kib
from ..paths import NATIVE_DIR, cache_dir
from ..procs import LineReader, describe_exit, stop
from .base import Suite, SuiteContext, SuiteError

COUNTS = (1, 4, 16, 64, 256, 1024, 4096)
QUICK_MAX = 1024
BLOCKS = 24  # threads_park.c's BLOCKS: the default and the most
SOURCE = NATIVE_DIR / "threads_park.c"


def build_threads_park(dest_dir: Path | None = None) -> Path:
    """Compiles threads_park.c (once per source version) and returns the binary."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if not cc:
        raise SuiteError("threads: no C compiler (cc) found: sudo apt-get install build-essential")
    src = SOURCE.read_bytes()
    tag = hashlib.sha256(src).hexdigest()[:12]
    d = Path(dest_dir) if dest_dir else cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    exe = d / f"threads_park-{tag}"
    if os.access(exe, os.X_OK):
        return exe
    tmp = d / f".threads_park-{tag}.{os.getpid()}"
    r = subprocess.run([cc, "-O2", "-std=gnu11", "-pthread", "-o", str(tmp), str(SOURCE)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise SuiteError(f"threads: compiling {SOURCE} failed:\n{r.stderr.strip()}")
    os.replace(tmp, exe)
    return exe


class ThreadsSuite(Suite):
    name = "threads"
    description = "RSS per parked thread for 1..4096 threads, each having allocated a little"
    needs_packages = ("build-essential",)

    def counts(self, ctx: SuiteContext) -> list[int]:
        spec = ctx.options.get("counts")
        if spec:
            try:
                counts = [int(x) for x in str(spec).split(",") if x.strip()]
            except ValueError:
                raise SuiteError(f"threads: bad counts {spec!r} (want e.g. 1,16,256)") from None
            if not counts or min(counts) < 1:
                raise SuiteError("threads: counts must be >= 1")
            return counts
        return [n for n in COUNTS if not ctx.quick or n <= QUICK_MAX]

    def blocks(self, ctx: SuiteContext) -> int:
        spec = ctx.options.get("blocks", BLOCKS)
        try:
            blocks = int(spec)
        except (TypeError, ValueError):
            raise SuiteError(f"threads: bad blocks {spec!r} (want 0-{BLOCKS})") from None
        if not 0 <= blocks <= BLOCKS:
            raise SuiteError(f"threads: blocks must be 0-{BLOCKS}, not {blocks}")
        return blocks

    def _number(self, ctx: SuiteContext, key: str, default, conv):
        raw = ctx.options.get(key, default)
        try:
            v = conv(raw)
        except (TypeError, ValueError):
            v = None
        if v is None or v < 0:
            raise SuiteError(f"threads: option {key}={raw!r}: expected a number >= 0")
        return v

    def stack_kib(self, ctx: SuiteContext) -> int:
        return self._number(ctx, "stack_kib", 256, int)

    def settle_s(self, ctx: SuiteContext) -> float:
        return self._number(ctx, "settle_ms", 150, float) / 1000

    def work(self, ctx: SuiteContext) -> tuple[int, int]:
        work = self._number(ctx, "work", 0, int)
        burst = self._number(ctx, "work_burst", 0, int)
        if work > 1_000_000:
            raise SuiteError(f"threads: work must be at most 1000000, not {work}")
        if burst > 1:
            raise SuiteError(f"threads: work_burst must be 0 or 1, not {burst}")
        return work, burst

    def check_options(self, ctx: SuiteContext) -> None:
        self.counts(ctx)
        self.blocks(ctx)
        self.stack_kib(ctx)
        self.settle_s(ctx)
        self.work(ctx)

    def check(self, ctx: SuiteContext) -> None:
        self.check_options(ctx)
        build_threads_park()

    def run(self, ctx: SuiteContext) -> dict:
        exe = build_threads_park()
        counts = self.counts(ctx)
        stack_kib = self.stack_kib(ctx)
        blocks = self.blocks(ctx)
        settle = self.settle_s(ctx)
        work = self.work(ctx)
        points, metrics, notes = [], {}, []
        for i, n in enumerate(counts):
            ctx.progress(f"{n} threads", i / len(counts))
            try:
                pt = self._one(ctx, exe, n, stack_kib, blocks, settle, work)
            except _TooMany as e:
                notes.append(f"stopped at {n} threads: {e}")
                break
            base = pt.pop("_base")
            points.append(pt)
            metrics[f"n{n}.rss_per_thread_kib"] = pt["rss_per_thread_kib"]
        ctx.progress("done", 1.0)
        if not points:
            raise SuiteError(f"threads under {ctx.allocator.name}: no thread count completed: "
                             + "; ".join(notes))
        last = points[-1]
        metrics.update(rss_per_thread_kib=last["rss_per_thread_kib"],
                       rss_peak_kib=last["rss_kib"], rss_base_kib=base,
                       start_ms=last["start_ms"])
        return {
            "metrics": metrics,
            "points": points,
            "x_label": "threads",
            "headline": {"speed": "start_ms", "memory": "rss_per_thread_kib"},
            "params": {"counts": counts, "stack_kib": stack_kib, "blocks": blocks,
                       "work": work[0], "work_burst": work[1]},
            "notes": notes,
        }

    def _one(self, ctx: SuiteContext, exe: Path, n: int, stack_kib: int, blocks: int,
             settle: float, work: tuple[int, int] = (0, 0)) -> dict:
        timeout = 30 + n / 50 + n * work[0] / 2e5
        p = subprocess.Popen([str(exe), str(n), str(stack_kib), str(blocks), str(work[0]),
                              str(work[1])], cwd=ctx.workdir,
                             env=ctx.allocator.env(), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
        rd = LineReader(p)
        stdin = p.stdin
        try:
            if stdin is None:
                raise RuntimeError("threads_park was started without a stdin pipe")
            self._expect(p, rd, "base", timeout, ctx.allocator.name)
            time.sleep(settle)
            base = rss_kib(p.pid)
            stdin.write(b"go\n")
            stdin.flush()
            line = self._expect(p, rd, "parked", timeout, ctx.allocator.name)
            start_ms = int(line.split()[1]) / 1e6
            time.sleep(settle)
            parked = rss_kib(p.pid)
            stdin.write(b"exit\n")
            stdin.flush()
            self._expect(p, rd, "done", timeout, ctx.allocator.name)
            p.wait(timeout=timeout)
            if base is None or parked is None:
                raise SuiteError(f"threads: could not read /proc/{p.pid}/status")
            return {"x": n, "rss_kib": parked, "rss_per_thread_kib": round((parked - base) / n, 2),
                    "start_ms": round(start_ms, 3), "_base": base}
        finally:
            stop(p)

    def _expect(self, p: subprocess.Popen, rd: LineReader, word: str, timeout: float,
                alloc: str) -> str:
        try:
            line = rd.readline(timeout)
        except TimeoutError:
            raise SuiteError(f"threads: threads_park did not say {word!r} within "
                             f"{timeout:.0f} s") from None
        if line is not None and line.startswith("error"):
            raise _TooMany(line.split(None, 2)[-1] + f" (after {line.split()[1]} threads)")
        if line is None or not line.startswith(word):
            try:
                p.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
            err = (p.stderr.read().decode("utf-8", "replace").strip()
                   if p.poll() is not None and p.stderr is not None else "")
            raise SuiteError(f"threads: threads_park under {alloc} ended or misbehaved "
                             f"(wanted {word!r}, got {line!r}; {describe_exit(p.poll())})"
                             + (f": {err[-500:]}" if err else ""))
        return line


class _TooMany(Exception):
    pass
