"""Reading callgrind's output: totals, the allocator's self cost, compressed names,
inclusive call costs left out."""
from __future__ import annotations

import os

import pytest

from keel_lab import cachesim

# A callgrind file with what the reader must handle: compressed names defined once and
# used again, relative positions (+N) and "*", a call whose inclusive cost line must not
# count as the caller's, an inlined file (fi=/fe=) in another object.
SAMPLE = """# callgrind format
version: 1
creator: test
events: Ir D1mr
ob=(1) /usr/lib/x86_64-linux-gnu/libc.so.6
fl=(1) ./malloc/./malloc/malloc.c
fn=(1) malloc
10 100 5
+2 50 1
cfl=(2) ./string/memset.S
cfn=(2) memset
calls=3 0
* 1000 30
fl=(2)
fn=(2)
0 900 20
ob=(2) /usr/sbin/mariadbd
fl=(3) sql.cc
fn=(3) main
5 10000 7
fi=(1)
7 3 1
fe=(3)
8 4 0
"""


def write(tmp_path, text, name="callgrind.out.1"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_totals_line_wins_and_glibc_malloc_is_the_part(tmp_path):
    p = write(tmp_path, SAMPLE + "totals: 12057 63\n")
    r = cachesim.parse(p, cachesim.allocator_part(None))
    assert r["events"] == ["Ir", "D1mr"]
    assert r["totals"] == {"Ir": 12057, "D1mr": 63}
    # malloc's own lines only: not memset's (another file), not the call's inclusive
    # cost, not malloc.c code inlined into mariadbd
    assert r["part"] == {"Ir": 150, "D1mr": 6}


def test_without_totals_the_self_costs_are_summed(tmp_path):
    r = cachesim.parse(write(tmp_path, SAMPLE))
    assert r["totals"] == {"Ir": 100 + 50 + 900 + 10000 + 3 + 4, "D1mr": 5 + 1 + 20 + 7 + 1}
    assert r["part"] == {"Ir": 0, "D1mr": 0}


def test_preloaded_library_matches_by_real_path(tmp_path):
    lib = tmp_path / "libkeel.so.0.1.0"
    lib.write_bytes(b"")
    link = tmp_path / "libkeel.so"
    os.symlink(lib.name, link)
    text = SAMPLE.replace("/usr/sbin/mariadbd", str(lib))
    r = cachesim.parse(write(tmp_path, text), cachesim.allocator_part(str(link)))
    assert r["part"] == {"Ir": 10000 + 3 + 4, "D1mr": 8}
    both = cachesim.add(r, r)
    assert both["part"]["Ir"] == 2 * r["part"]["Ir"] and both["totals"] == {
        k: 2 * v for k, v in r["totals"].items()}


def test_not_a_callgrind_file(tmp_path):
    with pytest.raises(cachesim.CallgrindError, match="no 'events:' line"):
        cachesim.parse(write(tmp_path, "hello\nworld\n"))
    with pytest.raises(cachesim.CallgrindError, match="cannot read"):
        cachesim.parse(tmp_path / "missing")


def test_host_cache_is_valgrinds_format_or_none():
    v = cachesim.host_cache()
    if v is None:
        pytest.skip("sysfs names no level-2 cache here")
    size, ways, line = (int(x) for x in v.split(","))
    assert size >= 64 << 10 and ways >= 1 and line in (32, 64, 128, 256)


def test_two_position_columns(tmp_path):
    """--dump-instr=yes puts an address before the line number of every cost line."""
    text = SAMPLE.replace("events: Ir D1mr", "positions: instr line\nevents: Ir D1mr")
    for old, new in (("\n10 100 5", "\n0x4000 10 100 5"), ("\n+2 50 1", "\n+8 +2 50 1"),
                     ("\n* 1000 30", "\n* * 1000 30"), ("\n0 900 20", "\n0x5000 0 900 20"),
                     ("\n5 10000 7", "\n0x6000 5 10000 7"), ("\n7 3 1", "\n+4 7 3 1"),
                     ("\n8 4 0", "\n+4 8 4 0")):
        assert old in text
        text = text.replace(old, new)
    r = cachesim.parse(write(tmp_path, text), cachesim.allocator_part(None))
    assert r["totals"] == {"Ir": 11057, "D1mr": 34}
    assert r["part"] == {"Ir": 150, "D1mr": 6}
