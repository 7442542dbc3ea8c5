"""Allocator specs: NAME, PATH, LABEL=NAME-or-PATH, each with +VAR=VALUE / +mesh variants,
and the environment a variant gives the programs run under it."""
from __future__ import annotations

import os

import pytest

from conftest import BUILD, keel
from keel_lab.allocators import (Allocator, AllocatorNotFound, BadAllocatorSpec, _split_extras,
                                 parse)


@pytest.fixture
def fake_keel(tmp_path):
    """A build directory with a file named libkeel.so (never loaded: only env() is used)."""
    (tmp_path / "libkeel.so").write_bytes(b"")
    return tmp_path


def test_plain_specs_are_unchanged(fake_keel):
    a = parse("keel", fake_keel)
    assert a == Allocator("keel", str(fake_keel / "libkeel.so")) and a.extra_env == ()
    assert a.is_keel
    g = parse("glibc", fake_keel)
    assert g == Allocator("glibc", None) and not g.is_keel
    env = g.env({"LD_PRELOAD": "/x.so", "HOME": "/h"})
    assert env == {"HOME": "/h"}
    lbl = parse(f"mine={fake_keel / 'libkeel.so'}", fake_keel)
    assert lbl.name == "mine" and lbl.is_keel and lbl.extra_env == ()


def test_mesh_shorthand_sets_keel_mesh(fake_keel):
    a = parse("keel+mesh", fake_keel)
    assert a.name == "keel+mesh" and a.is_keel
    assert a.path == str(fake_keel / "libkeel.so")
    assert a.extra_env == (("KEEL_MESH", "on"),)
    env = a.env({"PATH": "/bin", "LD_PRELOAD": "/other.so"})
    assert env == {"PATH": "/bin", "LD_PRELOAD": a.path, "KEEL_MESH": "on"}
    # the plain allocator's environment has none of it, and the two stay distinct
    plain = parse("keel", fake_keel)
    assert "KEEL_MESH" not in plain.env({}) and plain.name != a.name and plain != a


def test_variables_several_and_later_wins(fake_keel):
    a = parse("keel+KEEL_MESH=user+KEEL_PURGE_DELAY=100", fake_keel)
    assert a.name == "keel+KEEL_MESH=user+KEEL_PURGE_DELAY=100"
    assert a.env({}) == {"LD_PRELOAD": a.path, "KEEL_MESH": "user", "KEEL_PURGE_DELAY": "100"}
    b = parse("keel+mesh+KEEL_MESH=user", fake_keel)
    assert b.env({})["KEEL_MESH"] == "user"
    # the variant's variables win over the caller's environment
    assert a.env({"KEEL_MESH": "off"})["KEEL_MESH"] == "user"


def test_glibc_variant_has_no_preload():
    g = parse("glibc+MALLOC_ARENA_MAX=2")
    assert g.name == "glibc+MALLOC_ARENA_MAX=2" and g.path is None and not g.is_keel
    assert g.env({"LD_PRELOAD": "/x.so"}) == {"MALLOC_ARENA_MAX": "2"}
    assert parse("system+MALLOC_ARENA_MAX=2").name == "glibc+MALLOC_ARENA_MAX=2"


def test_label_with_variables(fake_keel):
    a = parse("meshed=keel+mesh", fake_keel)
    assert a.name == "meshed" and a.is_keel and dict(a.extra_env) == {"KEEL_MESH": "on"}
    b = parse(f"k2={fake_keel / 'libkeel.so'}+KEEL_THP=never", fake_keel)
    assert b.name == "k2" and b.is_keel and b.env({})["KEEL_THP"] == "never"


def test_plus_inside_paths_values_and_labels(tmp_path):
    d = tmp_path / "a+b"
    d.mkdir()
    (d / "libkeel.so").write_bytes(b"")
    a = parse(f"{d / 'libkeel.so'}+mesh")
    assert a.path == str((d / "libkeel.so").resolve()) and a.name == "keel+mesh"
    assert _split_extras("keel+KEEL_X=a+b+mesh") == ("keel", ["KEEL_X=a+b", "mesh"])
    # lower-case NAME= is no variable: "keel+fast" is a label here
    assert _split_extras(f"keel+fast={d}/libkeel.so") == (f"keel+fast={d}/libkeel.so", [])
    lbl = parse(f"keel+fast={d / 'libkeel.so'}")
    assert lbl.name == "keel+fast" and lbl.extra_env == ()


def test_bad_specs(fake_keel):
    with pytest.raises(BadAllocatorSpec, match="Keel option"):
        parse("glibc+mesh", fake_keel)
    with pytest.raises(BadAllocatorSpec, match="needs both"):
        parse("=keel", fake_keel)
    with pytest.raises(AllocatorNotFound, match="unknown allocator"):
        parse("nosuch+mesh", fake_keel)
    with pytest.raises(BadAllocatorSpec, match="must be in capitals"):
        parse("keel+lowercase=1", fake_keel)     # neither a variable nor a shorthand


def test_keel_run_gives_the_variant_its_environment():
    r = keel("run", "-a", "glibc+KEEL_LAB_TEST_VAR=x y", "--", "sh", "-c",
             'echo "[$KEEL_LAB_TEST_VAR][${LD_PRELOAD-unset}]"', check=True)
    assert r.stdout.strip() == "[x y][unset]"


def test_keel_run_keel_mesh(keel_path):
    r = keel("--build-dir", str(BUILD), "run", "-a", "keel+mesh", "--", "sh", "-c",
             'echo "[$KEEL_MESH][$LD_PRELOAD]"', check=True)
    out = r.stdout.strip()
    assert out.startswith("[on][") and os.path.realpath(out[5:-1]) == os.path.realpath(keel_path)


def test_keel_bench_refuses_a_bad_spec_even_with_skip_missing(tmp_path):
    r = keel("bench", "micro", "--allocators", "glibc+mesh", "--skip-missing", "--no-lock",
             "--out", str(tmp_path / "r.json"))
    assert r.returncode == 2 and "Keel option" in r.stderr
    assert not (tmp_path / "r.json").exists()
