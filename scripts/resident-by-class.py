#!/usr/bin/env python3
"""Where a running process's memory under Keel is resident: per size class's slabs,
large blocks, free units of the page heap and the chunk headers, from the chunk headers
(read through /proc/PID/mem) and /proc/PID/pagemap. Needs root (or CAP_SYS_PTRACE).

    python3 scripts/resident-by-class.py PID

Reads keel_chunk_t as src/core/chunk.h lays it out (a 4 MiB-aligned chunk starts
with the magic "KEELCHNK", the unit descriptors at byte 80, 48 bytes each: state at
16, class at 17, head at 18, units at 19) and the class sizes as size_class.c computes
them: change it with them. Issue 33's breakdown of Sphinx searchd was made with it."""
import struct, sys, collections
pid = int(sys.argv[1])
PAGE = 4096; UNIT = 1 << 16; CHUNK = 1 << 22
sizes = {}
def class_sizes():
    # class sizes recomputed as size_class.c does (c <= 64: 16*c; else nine per doubling)
    for c in range(1, 128):
        if c <= 64: sizes[c] = c * 16
        else:
            k = c - 65; b = 10 + k // 9; i = k % 9
            sizes[c] = (1 << b) + ((1 << (b - 6)) if i == 0 else i * (1 << (b - 3)))
class_sizes()
regions = []
for line in open(f"/proc/{pid}/maps"):
    a, rest = line.split(" ", 1)
    lo, hi = (int(x, 16) for x in a.split("-"))
    regions.append((lo, hi, line.strip()))
mem = open(f"/proc/{pid}/mem", "rb", 0)
pm = open(f"/proc/{pid}/pagemap", "rb", 0)
def resident(addr, npages):
    pm.seek(addr // PAGE * 8)
    data = pm.read(npages * 8)
    return sum(1 for (v,) in struct.iter_unpack("<Q", data) if v >> 63)
by = collections.Counter(); units_by = collections.Counter(); chunks = 0
for lo, hi, line in regions:
    base = (lo + CHUNK - 1) // CHUNK * CHUNK
    while base + CHUNK <= hi:
        try:
            mem.seek(base); hdr = mem.read(80 + 64 * 48)
        except OSError:
            base += CHUNK; continue
        if len(hdr) < 80 or hdr[:8] != b"KNHCLEEK":
            base += CHUNK; continue
        chunks += 1
        by["header"] += resident(base, UNIT // PAGE)
        u = 1
        while u < 64:
            d = hdr[80 + u * 48: 80 + (u + 1) * 48]
            state, cls, head, units = d[16], d[17], d[18], d[19]
            n = max(units, 1) if head == u else 1
            key = ("slab %d B" % sizes.get(cls, 0)) if state == 1 else ("large" if state == 2 else "free unit")
            by[key] += resident(base + u * UNIT, n * UNIT // PAGE)
            units_by[key] += n
            u += n
        base += CHUNK
print(f"{chunks} chunks")
tot = 0
for k, v in by.most_common(30):
    tot += v
    print(f"{k:>18}: {v * 4:>7} KiB resident in {units_by.get(k, 0) * 64:>6} KiB")
print(f"total resident in chunks: {sum(by.values()) * 4} KiB")
