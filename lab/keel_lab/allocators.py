"""Finding allocators (by name in Debian's library paths, or by path) and running
programs under them."""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


def multiarch() -> str:
    try:
        out = subprocess.run(["gcc", "-print-multiarch"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    import platform
    return {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}.get(
        platform.machine(), "x86_64-linux-gnu")


LIBDIRS = [f"/usr/lib/{multiarch()}", "/usr/lib", "/usr/local/lib", "/lib"]

# name -> (library file names to look for, Debian package that provides them)
KNOWN = {
    "jemalloc": (["libjemalloc.so.2"], "libjemalloc2"),
    "tcmalloc": (["libtcmalloc_minimal.so.4", "libtcmalloc.so.4"], "libtcmalloc-minimal4"),
    "mimalloc": (["libmimalloc.so.2", "libmimalloc.so.2.0"], "libmimalloc2.0"),
    "keel": (["libkeel.so", "libkeel.so.0"], "keel (build it: cmake -S . -B build && cmake --build build)"),
}
ALL_NAMES = ["glibc", "jemalloc", "tcmalloc", "mimalloc", "keel"]


class AllocatorNotFound(RuntimeError):
    pass


@dataclass(frozen=True)
class Allocator:
    name: str
    path: Optional[str]  # None: the system allocator (glibc), nothing preloaded

    def env(self, base: Optional[dict] = None) -> dict:
        """Environment for a child process that runs under this allocator."""
        env = dict(os.environ if base is None else base)
        env.pop("LD_PRELOAD", None)
        if self.path:
            env["LD_PRELOAD"] = self.path
        return env


def find(spec: str, build_dir: Path = Path("build")) -> Allocator:
    """An allocator by name (glibc, jemalloc, tcmalloc, mimalloc, keel) or path to a .so."""
    if spec in ("glibc", "system", "libc"):
        return Allocator("glibc", None)
    if "/" in spec or spec.endswith(".so") or ".so." in spec:
        p = Path(spec).expanduser()
        if not p.is_file():
            raise AllocatorNotFound(f"allocator library {spec} does not exist")
        return Allocator(p.name.split(".so")[0].removeprefix("lib") or spec, str(p.resolve()))
    if spec not in KNOWN:
        raise AllocatorNotFound(
            f"unknown allocator {spec!r}: use one of {', '.join(ALL_NAMES)} or a path to a .so")
    files, package = KNOWN[spec]
    dirs = [str(Path(build_dir).resolve())] if spec == "keel" else []
    dirs += [d for d in LIBDIRS]
    for d in dirs:
        for f in files:
            cand = Path(d) / f
            if cand.is_file():
                return Allocator(spec, str(cand))
    if spec == "keel":
        raise AllocatorNotFound(f"libkeel.so not found in {build_dir} or {LIBDIRS[0]}: {package}")
    raise AllocatorNotFound(
        f"{spec} is not installed ({' or '.join(files)} not found in {', '.join(LIBDIRS)}): "
        f"install it with: sudo apt-get install {package}")
