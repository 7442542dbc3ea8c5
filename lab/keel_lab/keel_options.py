"""Keel's run-time options: the one table the lab uses (`keel options`, reports, deploy).

The truth is src/core/options.c: every option is read at start-up from the program's
`keel_conf` string, then from the environment as KEEL_<NAME> (which wins), and most can
be changed while the program runs with keel_option_set() (include/keel.h). When an option is added there, add it here
(tests/test_cli.py fails until then). Sizes take K/M/G suffixes (binary: 1K = 1024), optionally
followed by B or iB; booleans take 1/0, on/off, yes/no, true/false. A bad value prints
one warning line and the default is used. tests/test_cli.py checks that this table and
options.c name the same variables.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KeelOption:
    env: str
    kind: str        # "milliseconds", "size", "bool"
    default: str
    meaning: str


OPTIONS: tuple[KeelOption, ...] = (
    KeelOption("KEEL_PURGE_DELAY", "milliseconds (or Ns)", "1000",
               "How long freed memory stays mapped before it is returned to the OS "
               "(purged). Lower: smaller RSS after a burst, more page faults when memory is "
               "reused; 0: as soon as possible."),
    KeelOption("KEEL_TCACHE_MAX", "size (K/M/G)", "1M",
               "Most bytes one thread's cache may hold. Bigger: fewer trips to the shared "
               "lists for threads that allocate a lot; more memory parked per thread (watch "
               "RSS per thread on servers with thousands of threads)."),
    KeelOption("KEEL_TCACHE_TOTAL", "size (K/M/G)", "32M",
               "What all thread caches may hold together: each cache's budget is at most "
               "this over the number of live threads (never below 16 KiB), so a server "
               "with a thread per connection keeps its free blocks bounded. Bigger: more "
               "cache per thread when there are more than ~32 threads."),
    KeelOption("KEEL_TCACHE_IDLE", "milliseconds (or Ns)", "1000",
               "A thread that has made no call beyond its cache's fast path for this long "
               "(a pooled connection waiting for its next client) gives its cache's free "
               "blocks back: the background thread takes them while the thread is not in "
               "malloc or free, and the thread starts a fresh cache when it next works. "
               "0: caches are kept for as long as their threads live."),
    KeelOption("KEEL_HUGE_PAGE_SIZE", "size (K/M/G)", "0 (ask the OS)",
               "Override the transparent huge page size Keel assumes; 0 uses what the "
               "kernel reports (/sys/kernel/mm/transparent_hugepage/hpage_pmd_size)."),
    KeelOption("KEEL_THP", "system|always|never|dense", "system",
               "Transparent huge pages for Keel's own memory. system: no advice, the "
               "machine's setting decides; always: madvise(MADV_HUGEPAGE), so Keel gets huge "
               "pages even where the machine says madvise, and free memory is then returned "
               "only in whole huge pages (never split); never: MADV_NOHUGEPAGE; dense: no huge "
               "page at fault time (no RSS for untouched memory, no 2 MiB zeroing on the "
               "allocating thread), and the background thread collapses the huge pages that "
               "are in use and resident (MADV_COLLAPSE, Linux 6.1+), keeps them whole while "
               "less than a quarter is free, and returns them to base pages beyond that. The "
               "machine's /sys/kernel/mm/transparent_hugepage setting is never changed "
               "(dense does nothing where it says never)."),
    KeelOption("KEEL_MESH", "off|on|user", "off",
               "Meshing: the purger lets pages of two slabs of a size class whose blocks in "
               "use sit at different offsets share one physical page (private views of a "
               "memory file), giving back memory deletes left scattered (docs/meshing.md). "
               "on: only with a userfaultfd write barrier that holds for the kernel's writes "
               "too (root, CAP_SYS_PTRACE, access to /dev/userfaultfd or "
               "vm.unprivileged_userfaultfd=1), else a warning and it stays off; user: also "
               "with a user-mode barrier, where a read(2) into a block being meshed fails "
               "with EFAULT. Each view is a kernel mapping: at most a third of "
               "vm.max_map_count is used. VmRSS does not show the gain (it counts a shared "
               "page once per view) and PSS misses views not read since meshing: measure "
               "RssAnon + RssFile + the keel-mesh memfd (keel bench: held_*_kib)."),
    KeelOption("KEEL_STATS", "bool", "off",
               "Print Keel's statistics (allocated, active, cached, mapped, committed, "
               "retained, metadata, purged bytes, threads) to stderr when the process exits."),
    KeelOption("KEEL_BACKGROUND_PURGE", "bool", "on",
               "A helper thread wakes every KEEL_PURGE_DELAY/4 and returns free memory whose "
               "delay has passed, so an idle process shrinks; off: purging only happens "
               "inside malloc/free calls."),
    KeelOption("KEEL_FINE_CLASSES", "size (K/M/G)", "4M",
               "Size classes. While Keel's slabs span less than this, requests are served "
               "by coarse classes (every 16 bytes up to 128, then four per doubling: up to "
               "25 % slack in a block, but fewer classes in use, so fewer partly used pages "
               "and cached blocks); from then on by all classes (16-byte steps to 1 KiB, "
               "nine per doubling above: 2^b + 2^b/64 for a power of two plus a header, then "
               "eight steps of 2^b/8), each coarse class's finer ones once it spans 16 slabs "
               "of its own. 0: all classes from the start."),
    KeelOption("KEEL_CPUS", "count", "0",
               "Processors Keel sizes its per-processor structures for (transfer lines: one "
               "per processor, 4 to 16); 0: the processors the process may run on. From 5 "
               "the many-core policies are on: each size class's slabs with free blocks on "
               "one list per processor, and, while the threads are no more than the "
               "lines, batches of freed blocks kept on their processor's line rather than "
               "handed to another core. Read once, when a second thread starts working."),
    KeelOption("KEEL_OWN_LINES", "bool", "off",
               "While the threads are no more than the processors, each processor keeps to "
               "itself its slabs, its transfer line (a thread parks freed batches on its own "
               "line only) and a chunk of memory, so that no block and no cache line of "
               "blocks passes between two busy cores. Less CPU time where threads each work "
               "through many blocks (bench/workset at 2 threads: 1.26x less), more peak RSS "
               "where threads come and go (bench/threadchurn 1.14x on 2 cores). Off until "
               "measured on many cores."),
    KeelOption("KEEL_CHILD_PURGER", "size (K/M/G)", "4M",
               "A forked child starts its own purger thread only once it has taken this "
               "much memory in spans and huge blocks since the fork (0: at the fork): "
               "creating a thread in a child maps in pages of every library, 1.5 MiB of RSS "
               "in each PostgreSQL helper. Until then the child publishes no statistics."),
    KeelOption("KEEL_CHECK", "bool", "off",
               "Checked mode for debugging: canaries after every block, freed blocks "
               "poisoned and held in a quarantine, size words protected; overflows, writes "
               "after free, double and invalid frees are reported where they are seen. Much "
               "slower (no thread caches): not for production."),
    KeelOption("KEEL_CHECK_GUARD", "size (K/M/G)", "0 (off)",
               "With KEEL_CHECK: blocks at least this big get their own mapping with an "
               "inaccessible guard page right after their end, so an overflow faults at "
               "the first byte and is reported with the block's address and size."),
    KeelOption("KEEL_PUBLISH", "bool", "on",
               "Publish live statistics in /dev/shm/keel-<pid> (mode 0600) once the process "
               "has lived a second, so another process can read them and ask for a purge "
               "(the lab's live view); refreshed by the background purger only when asked."),
    KeelOption("KEEL_PROFILE_RATE", "size (K/M/G)", "0 (off)",
               "Sampled heap profiling: about one sample per this many bytes allocated "
               "(e.g. 512K), with its stack; profiles are written in pprof's heap format. "
               "Off costs nothing measurable."),
    KeelOption("KEEL_PROFILE_GROWTH", "size (K/M/G)", "0 (off)",
               "With profiling on: write a profile each time the sampled live heap has grown "
               "by this much."),
    KeelOption("KEEL_PROFILE_AT_EXIT", "bool", "on",
               "With profiling on: write a profile when the process exits."),
    KeelOption("KEEL_PROFILE_LEAKS", "bool", "off",
               "With profiling on: report the sampled blocks still live at exit (leaks)."),
    KeelOption("KEEL_PROFILE_PREFIX", "path", "/tmp/keel-profile",
               "Where profiles go: PREFIX.<pid>.<n>.heap."),
)


def by_env() -> dict[str, KeelOption]:
    return {o.env: o for o in OPTIONS}
