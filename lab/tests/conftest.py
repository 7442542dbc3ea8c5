"""Shared helpers for the lab's tests.

Tests skip only when a prerequisite is really absent (and say which package to
install); CI installs everything (scripts/install-deps.sh), so normally nothing skips.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from keel_lab.allocators import AllocatorNotFound, find
from keel_lab.paths import SOURCE_DIR, default_build_dir

FIXTURES = Path(__file__).parent / "fixtures"
BUILD = default_build_dir()


def keel(*args: str, env: dict | None = None, timeout: float = 300, cwd=None,
         check: bool = False) -> subprocess.CompletedProcess:
    """Runs the CLI as `python -m keel_lab ARGS` and captures its output."""
    e = dict(os.environ if env is None else env)
    e.setdefault("COLUMNS", "160")
    r = subprocess.run([sys.executable, "-m", "keel_lab", *args], capture_output=True,
                       text=True, env=e, timeout=timeout, cwd=cwd)
    if check and r.returncode != 0:
        raise AssertionError(f"keel {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def need_allocator(name: str) -> str:
    try:
        return find(name, BUILD).path
    except AllocatorNotFound as e:
        pytest.skip(f"{name} is not available: {e}")


@pytest.fixture
def jemalloc_path() -> str:
    return need_allocator("jemalloc")


@pytest.fixture
def keel_path() -> str:
    lib = BUILD / "libkeel.so"
    if not lib.is_file():
        pytest.skip(f"{lib} is not built (cmake -S {SOURCE_DIR} -B {BUILD} -G Ninja && "
                    f"cmake --build {BUILD})")
    return str(lib)


@pytest.fixture
def cc() -> str:
    c = shutil.which("cc") or shutil.which("gcc")
    if not c:
        pytest.skip("no C compiler: apt-get install build-essential")
    return c


@pytest.fixture
def results_small(tmp_path) -> Path:
    p = tmp_path / "results_small.json"
    shutil.copy(FIXTURES / "results_small.json", p)
    return p


def build_jemalloc_linked(cc: str, tmp_path: Path, name: str, source: str, *libs: str) -> Path:
    """A C program linked to libjemalloc (as Debian's redis-server is), built in tmp_path;
    the test is skipped where libjemalloc's development files are missing."""
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    exe = tmp_path / name
    r = subprocess.run([cc, "-O1", str(src), "-o", str(exe), "-Wl,--no-as-needed", "-ljemalloc", *libs],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot link with -ljemalloc (apt-get install libjemalloc-dev): "
                    f"{r.stderr.strip()[-300:]}")
    return exe
