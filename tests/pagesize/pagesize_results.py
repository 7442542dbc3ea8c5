#!/usr/bin/env python3
"""Runs tests/pagesize/pagesize_probe under each page-size configuration and writes the
results as markdown (results/pagesize.md) and JSON, with the issue-8 targets checked.

Configurations:
  x86-64 native         the probe built natively, run as is
  arm64, 4 KiB pages    the arm64 probe under qemu-aarch64 -p 4096
  arm64, 16 KiB pages   ... -p 16384
  arm64, 64 KiB pages   ... -p 65536
  arm64, 64 KiB + 512M  ... -p 65536 with KEEL_HUGE_PAGE_SIZE=512M (the huge page of an
                        arm64 kernel with 64 KiB pages)

Targets, 64 KiB pages + 512 MiB huge page against 4 KiB pages (both arm64 under qemu):
  - committed bytes of the trivial program at most 2x;
  - committed bytes per parked thread at most 2x;
  - address space per parked thread never in huge-page units: Keel's own mappings per
    thread, and the process's virtual size per thread without the thread's stack, each at
    most 4 MiB (and far below the huge page size).

Usage:
  pagesize_results.py --native-probe build/tests/pagesize/pagesize_probe \
                      --cross-probe build-aarch64/tests/pagesize/pagesize_probe \
                      [--threads 256] [--out results/pagesize.md] [--json results/pagesize.json]
Exit status: 0 all targets met, 1 a target missed or a run failed, 2 usage.
Python 3 standard library only.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

KiB = 1024
MiB = 1024 * KiB
TARGET_RATIO = 2.0
TARGET_THREAD_VM = 4 * MiB


def fmt_bytes(n: float) -> str:
    neg = n < 0
    n = abs(n)
    if n >= MiB:
        s = f"{n / MiB:.2f} MiB"
    elif n >= KiB:
        s = f"{n / KiB:.1f} KiB"
    else:
        s = f"{int(n)} B"
    return ("-" if neg else "") + s


def fmt_page(n: int) -> str:
    if n >= MiB:
        return f"{n // MiB} MiB"
    return f"{n // KiB} KiB"


def run_probe(cmd: list[str], env_extra: dict[str, str], timeout: int) -> dict:
    env = dict(os.environ)
    # The probe must see only what the configuration sets.
    for k in ("KEEL_HUGE_PAGE_SIZE", "QEMU_PAGESIZE", "LD_PRELOAD"):
        env.pop(k, None)
    env.update(env_extra)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {r.returncode}:\n{r.stdout}{r.stderr}")
    return json.loads(r.stdout)


def tool_version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
        return out.splitlines()[0].strip() if out else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--native-probe", help="pagesize_probe built for this machine")
    ap.add_argument("--cross-probe", help="pagesize_probe built for arm64")
    ap.add_argument("--qemu", default="qemu-aarch64")
    ap.add_argument("--ld-prefix", default="/usr/aarch64-linux-gnu", help="qemu -L")
    ap.add_argument("--threads", type=int, default=256)
    ap.add_argument("--out", default="results/pagesize.md")
    ap.add_argument("--json", default=None, help="also write the raw figures here")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per probe run")
    args = ap.parse_args()
    if not args.native_probe and not args.cross_probe:
        ap.error("give --native-probe and/or --cross-probe")

    probe_args = ["--threads", str(args.threads), "--json"]
    configs = []  # (key, label, command, env)
    if args.native_probe:
        configs.append(("native", f"{platform.machine()} native", [args.native_probe, *probe_args], {}))
    if args.cross_probe:
        q = [args.qemu, "-L", args.ld_prefix]
        for p, label in ((4096, "4 KiB"), (16384, "16 KiB"), (65536, "64 KiB")):
            configs.append((f"arm64-{p}", f"arm64 (qemu), {label} pages",
                            [*q, "-p", str(p), args.cross_probe, *probe_args], {}))
        configs.append(("arm64-65536-huge512m", "arm64 (qemu), 64 KiB pages, KEEL_HUGE_PAGE_SIZE=512M",
                        [*q, "-p", "65536", args.cross_probe, *probe_args],
                        {"KEEL_HUGE_PAGE_SIZE": "512M"}))

    results: dict[str, dict] = {}
    failed_runs = []
    for key, label, cmd, env in configs:
        try:
            r = run_probe(cmd, env, args.timeout)
        except (RuntimeError, OSError, subprocess.SubprocessError, json.JSONDecodeError) as e:
            failed_runs.append(f"{label}: {e}")
            print(f"pagesize: {label}: FAILED: {e}", file=sys.stderr)
            continue
        r["label"] = label
        r["command"] = " ".join(f"{k}={v}" for k, v in env.items()) + (" " if env else "") + " ".join(cmd)
        results[key] = r
        print(f"pagesize: {label}: trivial committed {fmt_bytes(r['trivial']['committed'])}, "
              f"per thread committed {fmt_bytes(r['per_thread']['committed'])}, "
              f"Keel mappings {fmt_bytes(r['per_thread']['keel_vm'])}", file=sys.stderr)

    # ---- targets ----------------------------------------------------------------
    checks = []  # (what, value text, target text, ok)
    base, big = results.get("arm64-4096"), results.get("arm64-65536-huge512m")
    if base and big:
        def ratio(a: float, b: float) -> float:
            return a / b if b > 0 else (1.0 if a <= 0 else float("inf"))
        r1 = ratio(big["trivial"]["committed"], base["trivial"]["committed"])
        checks.append(("trivial program: committed, 64 KiB + 512M / 4 KiB",
                       f"{fmt_bytes(big['trivial']['committed'])} / {fmt_bytes(base['trivial']['committed'])} = {r1:.2f}x",
                       f"<= {TARGET_RATIO:.0f}x", r1 <= TARGET_RATIO))
        r2 = ratio(big["per_thread"]["committed"], base["per_thread"]["committed"])
        checks.append(("per parked thread: committed, 64 KiB + 512M / 4 KiB",
                       f"{fmt_bytes(big['per_thread']['committed'])} / {fmt_bytes(base['per_thread']['committed'])} = {r2:.2f}x",
                       f"<= {TARGET_RATIO:.0f}x", r2 <= TARGET_RATIO))
    elif args.cross_probe:
        failed_runs.append("the 4 KiB and 64 KiB + 512M arm64 runs are both needed for the ratios")
    for key, r in results.items():
        huge = r["huge_page_size"] or 0
        vm = r["per_thread"]["keel_vm"]
        ok = vm <= TARGET_THREAD_VM and (huge == 0 or vm < huge)
        checks.append((f"{r['label']}: Keel's mappings per parked thread", fmt_bytes(vm),
                       f"<= {fmt_bytes(TARGET_THREAD_VM)}, < huge page ({fmt_page(huge) if huge else 'none'})", ok))
        ns = r["per_thread"]["vsz_without_stack"]
        ok = ns <= TARGET_THREAD_VM and (huge == 0 or ns < huge)
        checks.append((f"{r['label']}: virtual size per parked thread without its stack", fmt_bytes(ns),
                       f"<= {fmt_bytes(TARGET_THREAD_VM)}", ok))
        if r["os_page_size"] != r["at_pagesz"]:
            checks.append((f"{r['label']}: Keel's page size = AT_PAGESZ",
                           f"{r['os_page_size']} vs {r['at_pagesz']}", "equal", False))
        if r["threads_intact"] != r["threads"]:
            checks.append((f"{r['label']}: threads with intact blocks",
                           f"{r['threads_intact']} of {r['threads']}", "all", False))
    all_ok = not failed_runs and all(c[3] for c in checks)

    # ---- markdown -----------------------------------------------------------------
    n = args.threads
    lines = []
    lines.append("# Keel with 4, 16 and 64 KiB pages")
    lines.append("")
    lines.append(f"What Keel commits and reserves for a trivial program and per parked thread "
                 f"({n} threads, each holding three small blocks, 24 + 200 + 1500 bytes, "
                 f"with 256 KiB stacks), by `tests/pagesize/pagesize_probe`. Per thread = "
                 f"(figure with {n} threads parked - figure before) / {n}. arm64 rows: the "
                 f"cross-built probe under qemu-user with `-p <page size>`.")
    lines.append("")
    hdr = ["configuration", "page size", "huge page Keel assumes",
           "trivial: committed", "trivial: Keel's mappings",
           "per thread: committed", "per thread: metadata", "per thread: Keel's mappings",
           "per thread: virtual size (stack + guard / rest)"]
    lines.append("| " + " | ".join(hdr) + " |")
    lines.append("|" + "---|" * len(hdr))
    order = ["arm64-4096", "arm64-16384", "arm64-65536", "arm64-65536-huge512m", "native"]
    for key in order:
        r = results.get(key)
        if not r:
            continue
        t, p = r["trivial"], r["per_thread"]
        row = [r["label"], fmt_page(r["at_pagesz"]),
               fmt_page(r["huge_page_size"]) if r["huge_page_size"] else "none",
               fmt_bytes(t["committed"]), fmt_bytes(t["keel_vm"]),
               fmt_bytes(p["committed"]), fmt_bytes(p["metadata"]), fmt_bytes(p["keel_vm"]),
               f"{fmt_bytes(p['vsz'])} ({fmt_bytes(r['stack_per_thread'])} / {fmt_bytes(p['vsz_without_stack'])})"]
        lines.append("| " + " | ".join(row) + " |")
    nat = results.get("native")
    if nat:
        lines.append("")
        lines.append(f"Natively the RSS is real: {nat['label']}, VmRSS of the trivial program "
                     f"{fmt_bytes(nat['trivial']['vm_rss'])}, per parked thread "
                     f"{fmt_bytes(nat['per_thread']['vm_rss'])} (its touched stack pages, TLS and "
                     f"thread cache).")
    lines.append("")
    lines.append("## Targets (64 KiB pages with a 512 MiB huge page, against 4 KiB pages)")
    lines.append("")
    lines.append("| check | measured | target | |")
    lines.append("|---|---|---|---|")
    for what, val, target, ok in checks:
        lines.append(f"| {what} | {val} | {target} | {'met' if ok else '**MISSED**'} |")
    for f in failed_runs:
        lines.append(f"| run failed | {f.splitlines()[0]} | | **FAILED** |")
    lines.append("")
    lines.append("## What the columns measure")
    lines.append("")
    lines.append("- **committed**: `keel_stats_get().committed`, the bytes of Keel's mappings not "
                 "returned to the OS (an upper bound of Keel's share of RSS). Under qemu-user the "
                 "RSS is qemu's own and says nothing about page sizes, so Keel's own count is used.")
    lines.append("- **metadata**: `keel_stats_get().metadata`, Keel's bookkeeping (thread caches, "
                 "page map leaves).")
    lines.append("- **Keel's mappings**: the address space Keel holds, counted at the source: the "
                 "probe defines `mmap`, `munmap` and `mremap`, so every call libkeel makes goes "
                 "through it (glibc's internal ones, e.g. for thread stacks, do not). It is "
                 "exact under qemu as natively.")
    lines.append("- **virtual size**: the sum of all mappings in `/proc/self/maps`, per thread. "
                 "Under qemu-user that file is the emulated program's view (qemu rewrites it); "
                 "`VmSize` in `/proc/self/status` is not used because under qemu it is qemu's "
                 "(translation buffer, host threads). The thread's stack and guard (found in "
                 "the maps: the mapping holding the thread's stack pointer and the `---p` "
                 "guard below it) are glibc's, sized by the program: 256 KiB + a guard of one "
                 "page, or 64 KiB on arm64 (glibc's minimum guard there). \"rest\" is "
                 "everything else a thread added.")
    lines.append("")
    lines.append(f"Produced by `tests/pagesize/pagesize_results.py` (`scripts/cross-aarch64.sh`) on "
                 f"{dt.date.today().isoformat()}: {platform.machine()} {platform.release()}, "
                 f"{tool_version([args.qemu, '--version']) if args.cross_probe else 'no qemu'}.")
    lines.append("")
    text = "\n".join(lines)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"results": results, "checks": [
            {"what": c[0], "measured": c[1], "target": c[2], "ok": c[3]} for c in checks],
            "failed_runs": failed_runs}, indent=1))
    print(text)
    met = sum(1 for c in checks if c[3])
    print(f"pagesize: {met} passed, {len(checks) - met + len(failed_runs)} failed -> {out}",
          file=sys.stderr)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
