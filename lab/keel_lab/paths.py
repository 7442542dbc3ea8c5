"""Where things are: the Keel source tree, its build directory, the lab's cache."""
from __future__ import annotations

import os
from pathlib import Path

LAB_DIR = Path(__file__).resolve().parent.parent          # .../lab
SOURCE_DIR = LAB_DIR.parent                               # the Keel checkout (if the lab lives in it)
NATIVE_DIR = Path(__file__).resolve().parent / "native"   # C helpers compiled at run time


def default_build_dir() -> Path:
    """$KEEL_BUILD_DIR, else <checkout>/build when the lab runs from a Keel checkout,
    else ./build."""
    env = os.environ.get("KEEL_BUILD_DIR")
    if env:
        return Path(env).expanduser().resolve()
    cand = SOURCE_DIR / "build"
    if (SOURCE_DIR / "CMakeLists.txt").is_file() and cand.is_dir():
        return cand
    return Path("build").resolve()


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/keel-lab (~/.cache/keel-lab): compiled helpers."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    d = Path(base) / "keel-lab"
    d.mkdir(parents=True, exist_ok=True)
    return d
