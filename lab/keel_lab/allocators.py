"""Finding allocators (by name in Debian's library paths, or by path) and running
programs under them.

An allocator spec (keel bench --allocators, keel run --allocator) is

    BASE[+EXTRA...]      BASE: a name (glibc, jemalloc, tcmalloc, mimalloc, keel), a path
                         to a .so, or LABEL=NAME-or-PATH (LABEL names it in results)
                         EXTRA: VAR=VALUE (VAR in capitals: A-Z, 0-9, _), set in the
                         environment of every program run under it, or a shorthand
                         (SHORTHANDS: mesh = KEEL_MESH=on, Keel only)

e.g. keel+mesh, keel+KEEL_MESH=user+KEEL_PURGE_DELAY=100, glibc+MALLOC_ARENA_MAX=2,
meshed=/opt/keel/libkeel.so+mesh. A variant is named by its spec as written (keel+mesh),
or by LABEL, so it gets its own column in results next to the plain allocator. A "+" not
followed by a shorthand or VAR= belongs to the path or value before it.
"""
from __future__ import annotations

import os
import re
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

# spec shorthand -> the environment it stands for (Keel only)
SHORTHANDS = {"mesh": (("KEEL_MESH", "on"),)}
_EXTRA_VAR = re.compile(r"[A-Z_][A-Z0-9_]*=")


class AllocatorNotFound(RuntimeError):
    pass


class BadAllocatorSpec(AllocatorNotFound):
    """A spec that cannot mean any allocator (a usage error, not a missing library)."""


@dataclass(frozen=True)
class Allocator:
    name: str
    path: Optional[str]  # None: the system allocator (glibc), nothing preloaded
    extra_env: tuple[tuple[str, str], ...] = ()   # set for every program run under it

    @property
    def is_keel(self) -> bool:
        """Keel, whatever the name: keel, a variant (keel+mesh) or a label for a libkeel."""
        if self.name == "keel" or self.name.startswith("keel+"):
            return True
        return bool(self.path) and os.path.basename(self.path or "").startswith("libkeel")

    def env(self, base: Optional[dict] = None) -> dict:
        """Environment for a child process that runs under this allocator: LD_PRELOAD
        (removed for glibc) and the variant's extra variables."""
        env = dict(os.environ if base is None else base)
        env.pop("LD_PRELOAD", None)
        if self.path:
            env["LD_PRELOAD"] = self.path
        env.update(self.extra_env)
        return env


def _split_extras(spec: str) -> tuple[str, list[str]]:
    """BASE and the EXTRA parts of BASE+EXTRA+...; a part that is neither a shorthand nor
    VAR=VALUE is glued back to the part before it (a "+" in a path or a value)."""
    parts = spec.split("+")
    base, extras = parts[0], []
    for p in parts[1:]:
        if p in SHORTHANDS or _EXTRA_VAR.match(p):
            extras.append(p)
        elif extras:
            extras[-1] += "+" + p
        else:
            base += "+" + p
    return base, extras


def parse(spec: str, build_dir: Path = Path("build")) -> Allocator:
    """An allocator from a spec (module docstring): NAME, PATH or LABEL=NAME-or-PATH,
    each optionally followed by +VAR=VALUE or +SHORTHAND parts."""
    spec = spec.strip()
    base, extras = _split_extras(spec)
    label = None
    if "=" in base:
        label, base = base.split("=", 1)
        if not label or not base:
            raise BadAllocatorSpec(f"allocator spec {spec!r}: LABEL=NAME-or-PATH needs both")
    try:
        a = find(base, build_dir)
    except AllocatorNotFound as e:
        if label and "+" in label:
            raise BadAllocatorSpec(
                f"allocator spec {spec!r} was read as LABEL=NAME-or-PATH with label {label!r} "
                f"({e}); a variable after + must be in capitals: +VAR=VALUE") from None
        raise
    env: dict[str, str] = {}
    for x in extras:
        if x in SHORTHANDS:
            env.update(SHORTHANDS[x])
        else:
            var, value = x.split("=", 1)
            env[var] = value
    if not extras:
        return Allocator(label or a.name, a.path)
    v = Allocator(label or "+".join([a.name, *extras]), a.path, tuple(env.items()))
    keel_only = [e for e in extras if e in SHORTHANDS]
    if keel_only and not v.is_keel:
        sets = ", ".join(f"{k}={x}" for k, x in SHORTHANDS[keel_only[0]])
        raise BadAllocatorSpec(f"allocator spec {spec!r}: +{keel_only[0]} is a Keel option "
                               f"({sets}), and {a.name} is not Keel")
    return v


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
