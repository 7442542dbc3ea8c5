"""Reading valgrind callgrind's output (with --cache-sim=yes): total events, and the
self cost of the functions of one part of the program (the allocator's).

Only what the lab needs from the format (valgrind's docs, "Callgrind Format
Specification"): "events:" names the columns; "ob=", "fl=", "fi=", "fe=", "fn=" set the
object, file and function that the following cost lines belong to, each either
"(id) name" the first time or "(id)" after; a cost line is its positions ("positions:"
names them, by default one: the line) followed by the events' counts, and the one right
after a "calls=" line is the inclusive cost of that call, which is the callee's and not
the caller's own, so it is skipped; "cob=", "cfi=", "cfl=", "cfn=" name a call's target
and define ids too."""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Optional

_NAMED = re.compile(r"^\((\d+)\)(?: (.*))?$")
# the position names callgrind may put in front of the counts (compressed: +N, -N, *)
_POS = re.compile(r"^([+-]?\d+|\*|0x[0-9a-fA-F]+|[+-]0x[0-9a-fA-F]+)$")


class CallgrindError(RuntimeError):
    """A callgrind output file that cannot be read as one."""


def parse(path: str | Path, part: Optional[Callable[[str, str], bool]] = None) -> dict:
    """{"events": [names], "totals": {name: count}, "part": {name: count}}, where part
    sums the self cost of every cost line whose object and file part(object, file)
    accepts (all zero without part). Several dumps of one run (FILE.1, FILE.2...) are
    read by calling this on each and adding the results."""
    events: list[str] = []
    npos = 1                # position columns before the counts ("positions: instr line": 2)
    totals: Optional[list[int]] = None
    names: dict[str, dict[str, str]] = {"ob": {}, "fl": {}, "fn": {}}
    kind_of = {"ob": "ob", "cob": "ob", "fl": "fl", "fi": "fl", "fe": "fl", "cfi": "fl",
               "cfl": "fl", "fn": "fn", "cfn": "fn"}
    ob = fl = ""
    in_part = False
    skip_next = False
    summed: list[int] = []
    part_sum: list[int] = []

    def resolve(kind: str, value: str) -> str:
        m = _NAMED.match(value)
        if not m:
            return value
        ident, name = m.group(1), m.group(2)
        table = names[kind]
        if name is not None:
            table[ident] = name
        return table.get(ident, "")

    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        raise CallgrindError(f"cannot read callgrind output {path}: {e}") from None
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        c = line[0]
        if c.isdigit() or c in "+-*":
            if not events:
                raise CallgrindError(f"{path}: cost line before the events: line")
            fields = line.split()
            if not all(_POS.match(f) for f in fields[:npos]):
                continue
            if skip_next:           # inclusive cost of the call just named
                skip_next = False
                continue
            counts = [int(x) for x in fields[npos:npos + len(events)]]
            for i, v in enumerate(counts):
                summed[i] += v
                if in_part:
                    part_sum[i] += v
            continue
        key, sep, value = line.partition("=")
        if sep:
            if key in kind_of:
                name = resolve(kind_of[key], value)
                if key == "ob":
                    ob = name
                elif key in ("fl", "fi", "fe"):
                    fl = name
                if key in ("ob", "fl", "fi", "fe") and part is not None:
                    in_part = part(ob, fl)
            elif key == "calls":
                skip_next = True
            continue
        key, sep, value = line.partition(":")
        if not sep:
            continue
        if key == "positions":
            npos = len(value.split()) or 1
        elif key == "events":
            events = value.split()
            summed = [0] * len(events)
            part_sum = [0] * len(events)
        elif key in ("totals", "summary"):
            totals = [int(x) for x in value.split()]
    if not events:
        raise CallgrindError(f"{path}: no 'events:' line; not a callgrind output file")
    if totals is None:      # older files: the sum of the cost lines is the total
        totals = summed
    return {"events": events,
            "totals": dict(zip(events, totals + [0] * (len(events) - len(totals)), strict=False)),
            "part": dict(zip(events, part_sum, strict=True))}


def allocator_part(preload: Optional[str]) -> Callable[[str, str], bool]:
    """Which cost lines are the allocator's: those in the preloaded library's object, or
    for glibc (no preload) those in libc's malloc sources (malloc.c, arena.c, hooks.c,
    which Debian's debug info names as .../malloc/<file>)."""
    if preload:
        real = os.path.realpath(preload)

        def in_lib(ob: str, fl: str) -> bool:
            return bool(ob) and (ob == preload or os.path.realpath(ob) == real)
        return in_lib

    def in_glibc_malloc(ob: str, fl: str) -> bool:
        return "libc.so" in os.path.basename(ob) and "/malloc/" in fl
    return in_glibc_malloc


def add(a: dict, b: dict) -> dict:
    """The sum of two parse() results of one run's dumps."""
    if a["events"] != b["events"]:
        raise CallgrindError(f"dumps with different events: {a['events']} / {b['events']}")
    return {"events": a["events"],
            "totals": {k: a["totals"][k] + b["totals"][k] for k in a["events"]},
            "part": {k: a["part"][k] + b["part"][k] for k in a["events"]}}


def host_cache(level: int = 2) -> Optional[str]:
    """valgrind's --LL value (size,ways,line) for this machine's level-`level` data or
    unified cache of CPU 0, read from sysfs; None when sysfs does not say."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for d in sorted(base.glob("index*")):
            if (d / "level").read_text().strip() != str(level):
                continue
            if (d / "type").read_text().strip() not in ("Unified", "Data"):
                continue
            size = (d / "size").read_text().strip()
            m = re.match(r"^(\d+)([KMG]?)$", size)
            if not m:
                return None
            n = int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]
            ways = int((d / "ways_of_associativity").read_text())
            line = int((d / "coherency_line_size").read_text())
            return f"{n},{ways},{line}"
    except (OSError, ValueError):
        return None
    return None
