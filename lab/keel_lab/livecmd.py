"""keel stats / top / purge / profile: looking inside a running process under Keel."""
from __future__ import annotations

import json
import sys
import time

from . import live


def _mib(n: float) -> str:
    return f"{n / 1048576:,.1f} MiB"


def _summary_table(snap: live.Snapshot, rss_kib: int, prev: live.Snapshot | None, dt: float):
    from rich.table import Table
    s = snap.stats
    rss = rss_kib * 1024
    t = Table(title=f"process {snap.pid} under Keel", title_justify="left", show_header=False)
    t.add_column("figure", style="bold")
    t.add_column("value", justify="right")
    t.add_column("meaning")
    frag = rss / s["allocated"] if s["allocated"] else 0.0
    t.add_row("RSS", _mib(rss), "resident memory of the whole process (/proc)")
    t.add_row("allocated", _mib(s["allocated"]), "live bytes the program holds")
    t.add_row("active", _mib(s["active"]), "bytes in slabs/spans with live blocks")
    t.add_row("cached", _mib(s["cached"]), "free blocks in thread/transfer caches")
    t.add_row("committed", _mib(s["committed"]), "Keel's memory not returned to the OS")
    t.add_row("mapped", _mib(s["mapped"]), "address space Keel has mapped")
    t.add_row("fragmentation", f"{frag:.2f}", "RSS / allocated")
    t.add_row("threads", f"{s['threads']} ({s['threads_total']} ever)", "threads that have used Keel (now, ever)")
    purged = s["purged_bytes"]
    rate = ""
    if prev is not None and dt > 0:
        rate = f"  (+{_mib((purged - prev.stats['purged_bytes']) / dt)}/s)"
    t.add_row("purged", _mib(purged) + rate, f"returned to the OS in {s['purge_runs']} passes")
    if snap.borrowed_blocks:  # layout 7; left out when 0, as KEEL_STATS=1 does
        t.add_row("borrowed", f"{snap.borrowed_blocks:,} blocks",
                  "blocks lent by larger classes' slabs")
    if snap.carved_holes:  # layout 8; left out when 0, as KEEL_STATS=1 does
        t.add_row("carved", f"{snap.carved_holes:,} holes",
                  "larger classes' free blocks holding smaller blocks")
    if snap.caches_taken_back:  # layout 9; left out when 0
        t.add_row("idle caches", f"{snap.caches_taken_back:,} taken back",
                  "waiting threads' cached free blocks returned")
    if snap.gathers:  # layout 10; left out when 0
        t.add_row("gathers", f"{snap.gathers:,} ({snap.blocks_gathered:,} blocks)",
                  "blocks above 8 KiB taken from other threads' bins before a new slab")
    for name in ("central", "page heap"):
        lk = (snap.locks or {}).get(name)
        if not lk:
            continue
        share = 100.0 * lk["contended"] / lk["acquired"] if lk["acquired"] else 0.0
        what = f"{lk['acquired']:,} taken, {share:.2f}% found held, {lk['sleeps']:,} waits"
        if prev is not None and dt > 0 and prev.locks and name in prev.locks:
            p = prev.locks[name]
            took = lk["acquired"] - p["acquired"]
            held = lk["contended"] - p["contended"]
            what = f"{took / dt:,.0f}/s taken, {100.0 * held / took if took else 0:.2f}% found held; " + what
        t.add_row(f"{name} lock", what, "Keel's shared structures: contention shows here")
    return t


def _classes_table(snap: live.Snapshot, top: int):
    from rich.table import Table
    t = Table(title=f"busiest size classes (top {top} by bytes in use)", title_justify="left")
    for col in ("block", "in use", "bytes in use", "cached", "slabs", "slab bytes", "util."):
        t.add_column(col, justify="right")
    busy = sorted((c for c in snap.classes if c.slabs or c.blocks_in_use),
                  key=lambda c: c.blocks_in_use * c.block_size, reverse=True)[:top]
    for c in busy:
        t.add_row(f"{c.block_size} B", f"{c.blocks_in_use:,}", _mib(c.blocks_in_use * c.block_size),
                  f"{c.blocks_cached:,}", f"{c.slabs:,}", _mib(c.slab_bytes),
                  f"{100 * c.utilisation:.0f}%")
    return t


def _mesh_table(rows: list[dict], page: int, rss_kib: int):
    from rich.table import Table
    t = Table(title="meshing estimate (nothing is moved): what pages of equal index in different "
                    "slabs, with no block in use at the same offset, could give back",
              title_justify="left")
    for col in ("block", "slab memory", "on free pages", "candidates", "pairs free", "views",
                "mappings", "up to 8 free", "views"):
        t.add_column(col, justify="right")
    for r in sorted(rows, key=lambda r: r["pages"], reverse=True):
        if not r["pages"]:
            continue
        t.add_row(f"{r['block_size']} B", _mib(r["pages"] * page), _mib(r["free_pages"] * page),
                  f"{r['candidates']:,}", _mib(r["pair_saved"] * page), f"{r['pair_views']:,}",
                  f"{r['pair_runs']:,}", _mib(r["group_saved"] * page), f"{r['group_views']:,}")
    tot = live.mesh_totals(rows, page)
    t.caption = (f"RSS {_mib(rss_kib * 1024)}; pairs would free {_mib(tot['pair_saved_bytes'])} "
                 f"with {tot['pair_views']:,} views in {tot['pair_runs']:,} mappings, groups of up to 8 "
                 f"{_mib(tot['group_saved_bytes'])} with {tot['group_views']:,} views "
                 f"(free pages are returned by the purger already, once idle)")
    return t


def mesh_stats_doc(ms: dict | None) -> dict | None:
    """The published meshing counters for --json (None when meshing is off or the
    process's Keel predates layout 5), with the state and barrier also named."""
    if not ms or ms["state"] == live.MESH_STATE_OFF:
        return None
    return {**ms, "state_name": live.MESH_STATES.get(ms["state"], str(ms["state"])),
            "barrier_name": live.MESH_BARRIERS.get(ms["barrier"], str(ms["barrier"]))}


def _mesh_stats_table(ms: dict, page: int):
    """What meshing (KEEL_MESH=on) has done in the process: keel_mesh_stats_t."""
    from rich.table import Table
    t = Table(title="meshing (KEEL_MESH=on; docs/meshing.md)", title_justify="left",
              show_header=False)
    t.add_column("figure", style="bold")
    t.add_column("value", justify="right")
    t.add_column("meaning")
    state = live.MESH_STATES.get(ms["state"], str(ms["state"]))
    what = {live.MESH_STATE_ON: "meshing runs in the purger",
            live.MESH_STATE_REFUSED: "impossible here: see the warning the process printed",
            live.MESH_STATE_CHILD: "a forked child: its parent owns the views"}.get(ms["state"], "")
    t.add_row("state", state, what)
    t.add_row("barrier", live.MESH_BARRIERS.get(ms["barrier"], str(ms["barrier"])),
              "write barrier (userfaultfd write-protection)")
    t.add_row("groups", f"{ms['groups']:,}", "file pages shared by views now (2 to 8 views each)")
    t.add_row("views", f"{ms['views']:,} / {ms['view_limit']:,}",
              "views now / the mapping budget (a third of vm.max_map_count)")
    t.add_row("mesh file", _mib(ms["file_bytes"]), "memory the mesh file holds")
    t.add_row("given back", f"{ms['meshed']:,} pages ({_mib(ms['meshed'] * page)})",
              "pages given back by meshing since start")
    t.add_row("eroded", f"{ms['eroded']:,}", "views written since (their page is private again)")
    t.add_row("left", f"{ms['left']:,}", "views replaced by fresh memory once their blocks were free")
    t.add_row("released", f"{ms['released']:,}", "file pages given back once no view read them")
    t.add_row("failed", f"{ms['failed']:,}", "operations given up (the kernel refused a step)")
    t.add_row("longest", f"{ms['longest_ns'] / 1e6:,.2f} ms",
              "the longest operation: writers to its pages waited this long")
    t.add_row("busy", f"{ms['busy_ns'] / 1e9:,.3f} s", "time spent in operations since start")
    return t


def cmd_stats(args) -> int:
    try:
        snap = live.read(args.pid)
        rss = live.rss_kib(args.pid)
        mesh = live.mesh_estimate(args.pid) if args.mesh else None
    except live.LiveError as e:
        print(f"keel: error: {e}", file=sys.stderr)
        return 1
    page = snap.stats["os_page_size"]
    if args.json:
        doc = {"pid": snap.pid, "rss_bytes": rss * 1024, **snap.stats, "locks": snap.locks or {},
               "classes": [c.__dict__ for c in snap.classes if c.slabs or c.blocks_in_use]}
        if snap.borrowed_blocks is not None:  # layout 7; keel_stats_json's name
            doc["borrowed_blocks"] = snap.borrowed_blocks
        if snap.carved_holes is not None:  # layout 8; keel_stats_json's name
            doc["carved_holes"] = snap.carved_holes
        if snap.caches_taken_back is not None:  # layout 9; keel_stats_json's name
            doc["caches_taken_back"] = snap.caches_taken_back
        if snap.gathers is not None:  # layout 10; keel_stats_json's names
            doc["gathers"] = snap.gathers
            doc["blocks_gathered"] = snap.blocks_gathered
        mesh_doc = mesh_stats_doc(snap.mesh_stats)
        if mesh_doc is not None:
            doc["mesh_stats"] = mesh_doc
        if mesh is not None:
            doc["mesh_estimate"] = {"classes": mesh, **live.mesh_totals(mesh, page)}
        print(json.dumps(doc, indent=1))
        return 0
    from rich.console import Console
    con = Console(highlight=False, width=120)
    con.print(_summary_table(snap, rss, None, 0))
    con.print(_classes_table(snap, args.classes))
    if snap.mesh_stats is not None and mesh_stats_doc(snap.mesh_stats) is not None:
        con.print(_mesh_stats_table(snap.mesh_stats, page))
    if mesh is not None:
        con.print(_mesh_table(mesh, page, rss))
    return 0


def cmd_top(args) -> int:
    from rich.console import Console, Group
    from rich.live import Live
    con = Console(highlight=False, width=120)
    prev, prev_t = None, 0.0

    def frame():
        nonlocal prev, prev_t
        snap = live.read(args.pid)
        now = time.monotonic()
        g = Group(_summary_table(snap, live.rss_kib(args.pid), prev, now - prev_t if prev else 0),
                  _classes_table(snap, args.classes))
        prev, prev_t = snap, now
        return g

    try:
        if args.count:  # a fixed number of frames, printed one after another (logs, notes)
            for i in range(args.count):
                if i:
                    time.sleep(args.interval)
                con.print(frame())
            return 0
        with Live(frame(), console=con, refresh_per_second=4, screen=False) as view:
            while True:
                time.sleep(args.interval)
                view.update(frame())
    except live.LiveError as e:
        print(f"keel: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


def cmd_purge(args) -> int:
    try:
        before = live.rss_kib(args.pid)
        snap = live.purge(args.pid)
        time.sleep(0.1)
        after = live.rss_kib(args.pid)
    except (live.LiveError, FileNotFoundError) as e:
        print(f"keel: error: {e}", file=sys.stderr)
        return 1
    print(f"process {args.pid}: Keel returned {_mib(snap.purged_on_request)} to the OS; "
          f"RSS {_mib(before * 1024)} -> {_mib(after * 1024)}")
    return 0


def cmd_profile(args) -> int:
    try:
        path = live.profile(args.pid)
    except live.LiveError as e:
        print(f"keel: error: {e}", file=sys.stderr)
        return 1
    print(path)
    print(f"read it with: go tool pprof -top /proc/{args.pid}/exe {path}", file=sys.stderr)
    return 0


def add_parsers(sub, fmt) -> None:
    st = sub.add_parser("stats", help="statistics of a running process under Keel")
    st.add_argument("pid", type=int)
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument("--classes", type=int, default=10, help="size classes to show (default 10)")
    st.add_argument("--mesh", action="store_true",
                    help="also estimate what meshing could give back (docs/meshing.md)")
    st.set_defaults(func=cmd_stats)
    tp = sub.add_parser("top", help="refreshing view of a running process under Keel")
    tp.add_argument("pid", type=int)
    tp.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    tp.add_argument("--count", type=int, default=0,
                    help="print this many frames and exit (default: refresh until Ctrl-C)")
    tp.add_argument("--classes", type=int, default=8)
    tp.set_defaults(func=cmd_top)
    pg = sub.add_parser("purge", help="ask a running process under Keel to return free memory now")
    pg.add_argument("pid", type=int)
    pg.set_defaults(func=cmd_purge)
    pf = sub.add_parser("profile", help="write a heap profile of a running process (KEEL_PROFILE_RATE)")
    pf.add_argument("pid", type=int)
    pf.set_defaults(func=cmd_profile)
