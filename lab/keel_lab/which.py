"""Which allocator does a process really use, and how did it get there?

The dynamic loader resolves `malloc` (and free, realloc, ...) to the first object in
the program's global lookup scope that defines it. That scope is, in order:

  1. the executable itself          -> an allocator linked in statically ("static")
  2. the LD_PRELOAD libraries       -> "LD_PRELOAD" (from /proc/PID/environ)
  3. /etc/ld.so.preload             -> "ld.so.preload" (system-wide)
  4. DT_NEEDED libraries, breadth first (the executable's, then theirs) -> "linked"

so we rebuild that order for a live process from /proc/PID/maps (which files are
mapped), /proc/PID/exe and the ELF files themselves (DT_NEEDED, DT_SONAME, the symbols
they define), and /proc/PID/environ, and take the first object that defines malloc.
An allocator can also be compiled into the program under prefixed names (Redis built
from source: je_malloc, called by its zmalloc layer): then the program's own data goes
to that allocator whatever LD_PRELOAD says, and only the other libraries' malloc
calls are redirected. Allocator libraries that are mapped but not in the scope were
dlopen()ed and do not serve malloc.

`keel which -- CMD...` starts CMD under the current environment, inspects it after a
short moment (--wait, default 0.5 s) and then stops it (SIGTERM to its process group,
SIGKILL after 3 s), and by their own PIDs whatever it started outside that group
(daemons, setsid children: keel is their child subreaper meanwhile). A command that
daemonised is inspected through the process it left; one that exits before that is
analysed without running: from `ldd` under the same environment, which lists the
objects in load order.
"""
from __future__ import annotations

import os
import pwd
import re
import signal
import subprocess
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from . import procfs, procs
from .elf import open_elf

FAMILIES = ("keel", "jemalloc", "tcmalloc", "mimalloc", "glibc")

# Symbols whose definition identifies an allocator (checked in .dynsym, then .symtab).
MARKERS = {
    "keel": {"keel_version", "keel_stats_get", "keel_purge"},
    "jemalloc": {"mallctl", "je_mallctl", "je_malloc", "mallocx", "je_mallocx",
                 "malloc_stats_print", "je_malloc_stats_print"},
    "tcmalloc": {"tc_malloc", "tc_free", "MallocExtension_GetNumericProperty"},
    "mimalloc": {"mi_malloc", "mi_free", "mi_version"},
    "glibc": {"__libc_malloc"},
}
PREFIXED = {"je_malloc": "jemalloc", "tc_malloc": "tcmalloc", "mi_malloc": "mimalloc"}
# Strings that only the allocator's own code contains (for stripped static binaries).
STRING_MARKERS = {
    "jemalloc": b"<jemalloc>: ",
    "mimalloc": b"mimalloc: warning: ",
    "keel": b"KEEL_PURGE_DELAY",
    "tcmalloc": b"TCMALLOC_SAMPLE_PARAMETER",
}
# glibc's malloc, linked into a static executable (stripped: no symbols to go by).
GLIBC_MALLOC_STRING = b"malloc(): corrupted top size"
# glibc's dynamic loaders (ld-linux-x86-64.so.2, ld-linux-aarch64.so.1, ld-linux.so.2,
# ld64.so.2, ld.so.1): they honour LD_TRACE_LOADED_OBJECTS and list instead of running.
GLIBC_LOADER_RE = re.compile(r"^(ld-linux[-\w]*\.so\.\d+|ld64\.so\.\d+|ld\.so\.\d+)$")
NAME_RE = {
    "keel": re.compile(r"^libkeel(\.|-)"),
    "jemalloc": re.compile(r"^libjemalloc"),
    "tcmalloc": re.compile(r"^libtcmalloc"),
    "mimalloc": re.compile(r"^libmimalloc"),
    "glibc": re.compile(r"^libc(\.so|-2\.)"),
}
INTERESTING = set().union(*MARKERS.values(), {"malloc", "free"}, PREFIXED)


class WhichError(RuntimeError):
    """A failure with a message meant for the operator."""


@dataclass
class LoadedObject:
    path: str
    family: Optional[str]           # allocator family if this object is an allocator
    defines_malloc: bool
    how: str                        # executable | LD_PRELOAD | ld.so.preload | linked | dlopen
    via: Optional[str] = None       # for "linked": the object whose DT_NEEDED named it


@dataclass
class WhichResult:
    pid: Optional[int]
    exe: Optional[str]
    cmdline: Optional[str]
    allocator: str                   # family name, or "unknown"
    library: Optional[str]           # path of the object that serves malloc
    how: str                         # static | LD_PRELOAD | ld.so.preload | linked | none
    detail: str                      # one sentence: how it got there
    ld_preload: Optional[str] = None         # LD_PRELOAD as the process saw it (None: unknown)
    environ_readable: bool = True
    own_allocator: Optional[str] = None      # prefixed allocator compiled into the program
    others: list[dict] = field(default_factory=list)   # other allocator objects mapped
    notes: list[str] = field(default_factory=list)
    method: str = "live"             # live (from /proc) | predicted (ldd, did not run)

    def to_dict(self) -> dict:
        return asdict(self)

    def render(self) -> str:
        lines = []
        head = f"PID {self.pid}" if self.pid is not None else "command"
        if self.cmdline:
            head += f": {self.cmdline}"
        lines.append(head)
        if self.exe:
            lines.append(f"  executable: {self.exe}")
        lib = f" ({self.library})" if self.library else ""
        lines.append(f"  allocator:  {self.allocator}{lib}")
        lines.append(f"  how:        {self.how} -- {self.detail}")
        if self.own_allocator:
            lines.append(f"  own:        {self.own_allocator}")
        if self.ld_preload is not None:
            lines.append(f"  LD_PRELOAD: {self.ld_preload or '(not set)'}")
        elif not self.environ_readable:
            lines.append("  LD_PRELOAD: unknown (/proc/PID/environ is not readable)")
        for o in self.others:
            lines.append(f"  also:       {o['family']} {o['path']} ({o['how']}) -- {o['why']}")
        for n in self.notes:
            lines.append(f"  note:       {n}")
        if self.method == "predicted":
            lines.append("  (predicted from the executable and the environment, not read from "
                         "a running process)")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------
# classifying ELF objects


def classify(path: str) -> tuple[Optional[str], bool, set[str]]:
    """(allocator family or None, defines malloc?, interesting defined symbols)"""
    elf = open_elf(path)
    if elf is None:
        fam = next((f for f, r in NAME_RE.items() if r.match(os.path.basename(path))), None)
        return fam, fam is not None and fam != "glibc", set()
    syms = elf.defined_symbols("dynsym", INTERESTING)
    fam = next((f for f in FAMILIES if MARKERS[f] & syms), None)
    if fam is None and "malloc" in syms:
        fam = next((f for f, r in NAME_RE.items() if r.match(os.path.basename(path))), None)
    return fam, "malloc" in syms, syms


def static_allocator(exe_path: str) -> tuple[Optional[str], Optional[str]]:
    """For an executable: (family, kind) of an allocator compiled into it, where kind is
    "unprefixed" (it defines malloc itself), "prefixed" (je_malloc & co.) or None."""
    elf = open_elf(exe_path)
    if elf is None:
        return None, None
    dyn = elf.defined_symbols("dynsym", INTERESTING)
    syms = dyn | elf.defined_symbols("symtab", INTERESTING)
    fam = next((f for f in FAMILIES if f != "glibc" and MARKERS[f] & syms), None)
    if "malloc" in syms and fam is None and "__libc_malloc" not in syms:
        # an allocator we do not know by name; malloc defined by the program itself
        return "unknown", "unprefixed" if "malloc" in dyn or elf.is_static else None
    if fam is None and elf.is_static and "malloc" in syms and "__libc_malloc" in syms:
        return "glibc", "unprefixed"         # glibc's own malloc, linked in
    if fam is None:
        # stripped: look for strings only the allocator's code has
        fam = next((f for f, s in STRING_MARKERS.items() if elf.contains(s)), None)
        glibc = elf.is_static and elf.contains(GLIBC_MALLOC_STRING)
        if fam is None:
            return ("glibc", "unprefixed") if glibc else (None, None)
        # a static executable has glibc's malloc only if nothing else defines malloc
        return fam, ("unprefixed" if "malloc" in dyn or (elf.is_static and not glibc)
                     else "prefixed")
    if "malloc" in dyn or ("malloc" in syms and elf.is_static):
        return fam, "unprefixed"
    return fam, "prefixed"


# ---------------------------------------------------------------------------------
# live processes


def _proc_read(pid: int, name: str, binary: bool = False):
    p = f"/proc/{pid}/{name}"
    with open(p, "rb" if binary else "r") as f:
        return f.read()


def _owner(pid: int) -> str:
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        try:
            return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
        except KeyError:
            return f"uid {uid}"
    except OSError:
        return "another user"


def _permission_error(pid: int, what: str) -> WhichError:
    if os.geteuid() == 0:
        return WhichError(
            f"cannot read /proc/{pid}/{what}: permission denied even as root: PID {pid} is "
            f"protected (another PID or user namespace, a container, or a security module "
            f"such as Yama or AppArmor)")
    me = pwd.getpwuid(os.getuid()).pw_name
    return WhichError(
        f"cannot read /proc/{pid}/{what}: permission denied. PID {pid} belongs to "
        f"{_owner(pid)} and you are {me}; run as that user or as root "
        f"(sudo keel which {pid}). Kernels with Yama ptrace_scope >= 2 or hidepid=2 on /proc "
        f"also hide other users' processes.")


def _maps(pid: int) -> list[tuple[int, int, str]]:
    """[(start address, file offset, path)] of the file mappings, in address order."""
    try:
        text = _proc_read(pid, "maps")
    except FileNotFoundError:
        raise WhichError(f"no process with PID {pid} (it may have exited)") from None
    except PermissionError:
        raise _permission_error(pid, "maps") from None
    except ProcessLookupError:
        raise WhichError(f"no process with PID {pid} (it may have exited)") from None
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = parts[5].removesuffix(" (deleted)")
        out.append((int(parts[0].split("-")[0], 16), int(parts[2], 16), path))
    return out


def _mapped_files(pid: int) -> list[str]:
    seen, out = set(), []
    for _a, _o, path in _maps(pid):
        if path not in seen:
            seen.add(path)
            out.append(path)
    return out


def link_map_order(pid: int, maps: Optional[list[tuple[int, int, str]]] = None) -> Optional[list[str]]:
    """The loader's own list of loaded objects (r_debug.r_map), in load order: the
    executable, the preloads, the DT_NEEDED libraries, then anything dlopen()ed.
    Read from /proc/PID/mem, which needs ptrace rights (root, or the same user when
    Yama allows it). None if it cannot be read."""
    import struct
    maps = maps if maps is not None else _maps(pid)
    ld = next(((a, o, p) for a, o, p in maps
               if os.path.basename(p).startswith("ld-") and ".so" in p and o == 0), None)
    if ld is None:
        return None
    elf = open_elf(_host_path(pid, ld[2]))
    if elf is None:
        return None
    off = elf.symbol_value("_r_debug")
    if off is None:
        return None
    base = ld[0] - elf.first_load_vaddr()
    ptr = 8 if elf.is64 else 4
    pfmt = elf.end + ("Q" if elf.is64 else "I")
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError:
        return None
    try:
        def rd(addr: int, n: int) -> bytes:
            return os.pread(fd, n, addr)

        def rptr(addr: int) -> int:
            return struct.unpack(pfmt, rd(addr, ptr))[0]

        def rstr(addr: int) -> str:
            out = b""
            while len(out) < 4096:
                chunk = rd(addr + len(out), 256)
                if not chunk:
                    break
                i = chunk.find(b"\0")
                if i >= 0:
                    return (out + chunk[:i]).decode("utf-8", "replace")
                out += chunk
            return out.decode("utf-8", "replace")

        node = rptr(base + off + ptr)      # r_debug.r_map (after the int r_version, aligned)
        names = []
        for _ in range(4096):
            if not node:
                break
            name_p = rptr(node + ptr)      # link_map.l_name
            names.append(rstr(name_p) if name_p else "")
            node = rptr(node + 3 * ptr)    # link_map.l_next
        return names or None
    except (OSError, struct.error):
        return None
    finally:
        os.close(fd)


def _host_path(pid: Optional[int], path: str) -> str:
    """The path as seen from here (the process may live in another mount namespace)."""
    if pid is not None and os.getuid() == 0:
        root = f"/proc/{pid}/root"
        try:
            if os.readlink(root) != "/":
                cand = root + path
                if os.path.exists(cand):
                    return cand
        except OSError:
            pass
    return path


def _split_preload(value: str) -> list[str]:
    return [p for p in re.split(r"[:\s]+", value) if p]


def _ld_so_preload() -> list[str]:
    try:
        text = Path("/etc/ld.so.preload").read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        out += _split_preload(line)
    return out


def _match(entry: str, objects: list[str]) -> Optional[str]:
    """The mapped object an LD_PRELOAD entry refers to (by path, real path or file name)."""
    real = os.path.realpath(entry) if "/" in entry else None
    for o in objects:
        if o == entry or (real and os.path.realpath(o) == real):
            return o
    base = os.path.basename(entry)
    for o in objects:
        if os.path.basename(o) == base:
            return o
    return None


def inspect_pid(pid: int) -> WhichResult:
    if pid <= 0:
        raise WhichError(f"{pid} is not a valid PID")
    if not os.path.exists(f"/proc/{pid}"):
        raise WhichError(f"no process with PID {pid} (it may have exited)")
    maps = _maps(pid)
    mapped = list(dict.fromkeys(p for _a, _o, p in maps))
    try:
        cmdline = _proc_read(pid, "cmdline", binary=True).replace(b"\0", b" ").decode(
            "utf-8", "replace").strip() or None
    except OSError:
        cmdline = None
    if not mapped:
        try:
            state = _proc_read(pid, "stat").rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            state = "?"
        if state == "Z":
            raise WhichError(f"PID {pid} is a zombie (it has exited; its parent has not "
                             "reaped it yet): there is no memory left to inspect")
        if not os.path.exists(f"/proc/{pid}"):
            raise WhichError(f"no process with PID {pid} (it exited while being inspected)")
        raise WhichError(f"PID {pid} has no user-space memory (a kernel thread?): "
                         "it does not use malloc")
    try:
        exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except PermissionError:
        raise _permission_error(pid, "exe") from None
    except OSError:
        exe = mapped[0]
    ld_preload, environ_ok = None, True
    try:
        env = _proc_read(pid, "environ", binary=True).split(b"\0")
        ld_preload = ""
        for kv in env:
            if kv.startswith(b"LD_PRELOAD="):
                ld_preload = kv.split(b"=", 1)[1].decode("utf-8", "replace")
    except PermissionError:
        environ_ok = False
    except FileNotFoundError:
        raise WhichError(f"no process with PID {pid} (it exited while being inspected)") from None
    order = link_map_order(pid, maps)
    res = analyze(exe, mapped, ld_preload, pid=pid, order=order,
                  order_source="the loader's link map")
    res.cmdline = cmdline
    res.environ_readable = environ_ok
    if not environ_ok:
        res.notes.append("/proc/PID/environ is not readable: preloads were inferred from the "
                         "load order or the mapped libraries")
    return res


def analyze(exe: str, mapped: list[str], ld_preload: Optional[str], pid: Optional[int] = None,
            order: Optional[list[str]] = None, order_source: str = "") -> WhichResult:
    """Works out the lookup scope and who serves malloc.
    mapped: files mapped by the process (any order); ld_preload: its LD_PRELOAD ("" not
    set, None unknown); order: the loaded objects in load order when known (the
    loader's link_map, or ldd), which tells preloaded libraries from dlopen()ed ones."""
    def hp(p: str) -> str:
        h = _host_path(pid, p)
        if p == exe and pid is not None and not os.path.exists(h):
            return f"/proc/{pid}/exe"    # the binary was replaced or deleted since it started
        return h

    notes: list[str] = []
    libs = [m for m in mapped if m != exe and open_elf(hp(m)) is not None]
    by_name: dict[str, str] = {}
    for m in libs:
        elf = open_elf(hp(m))
        if elf is not None and elf.soname:
            by_name.setdefault(elf.soname, m)
        by_name.setdefault(os.path.basename(m), m)

    # DT_NEEDED closure, breadth first from the executable
    closure: dict[str, str] = {}
    queue = deque([exe])
    while queue:
        cur = queue.popleft()
        elf = open_elf(hp(cur))
        if elf is None:
            continue
        for n in elf.needed:
            dep = by_name.get(n)
            if dep and dep != exe and dep not in closure:
                closure[dep] = cur
                queue.append(dep)

    pos: dict[str, int] = {}
    if order:
        for i, name in enumerate(order):
            if name.startswith("/"):
                hit = _match(name, libs)
                if hit is not None:
                    pos.setdefault(hit, i)

    # preloads: named by LD_PRELOAD / ld.so.preload, or loaded before every linked library
    preloads: list[tuple[str, str, str]] = []        # (path, how, evidence)
    for e in _split_preload(ld_preload) if ld_preload else []:
        hit = _match(e, libs)
        if hit:
            preloads.append((hit, "LD_PRELOAD", "named by LD_PRELOAD in /proc/PID/environ"))
        else:
            notes.append(f"LD_PRELOAD names {e}, but no such library is loaded: the loader "
                         "ignored it (missing file, wrong architecture, or a setuid program "
                         "that ignores LD_PRELOAD paths)")
    for e in _ld_so_preload():
        hit = _match(e, libs)
        if hit and hit not in [p[0] for p in preloads]:
            preloads.append((hit, "ld.so.preload", "named by /etc/ld.so.preload"))
    named = {p[0] for p in preloads}
    # A preloaded library that the program also links (LD_PRELOAD=libc.so.6 for a program
    # linked to libjemalloc): the loader loads it before the executable's own DT_NEEDED
    # libraries, so the load order shows it ahead of a library the executable names
    # before it (or at all, for an indirect dependency).
    if pos:
        exe_elf0 = open_elf(hp(exe))
        direct = list(dict.fromkeys(
            by_name[n] for n in (exe_elf0.needed if exe_elf0 is not None else [])
            if n in by_name and by_name[n] in closure
            and not os.path.basename(by_name[n]).startswith("ld-")))
        for m in closure:
            if m in named or m not in pos or os.path.basename(m).startswith("ld-"):
                continue
            before = direct[:direct.index(m)] if m in direct else direct
            if any(n in pos and pos[n] > pos[m] for n in before):
                preloads.append((m, "LD_PRELOAD", f"loaded ahead of the libraries the "
                                                  f"executable links ({order_source}), "
                                                  f"although it is also linked"))
                named.add(m)
                if ld_preload == "":
                    notes.append("/proc/PID/environ does not show LD_PRELOAD although a "
                                 "library was preloaded: the program rewrote its environment "
                                 "area (Redis and PostgreSQL do, to set their process title)")
    dlopened: list[str] = []
    first_linked = min((pos[m] for m in closure if m in pos and m not in named), default=None)
    for m in libs:
        if m in closure or m in named:
            continue
        base = os.path.basename(m)
        if base.startswith("ld-") or m == exe:
            continue
        if first_linked is not None and m in pos:
            if pos[m] < first_linked:
                preloads.append((m, "LD_PRELOAD", f"loaded before every linked library "
                                                  f"({order_source}) but not named by the "
                                                  f"environment as read"))
                if ld_preload == "":
                    notes.append("/proc/PID/environ does not show LD_PRELOAD although a "
                                 "library was preloaded: the program rewrote its environment "
                                 "area (Redis and PostgreSQL do, to set their process title)")
            else:
                dlopened.append(m)
        else:
            fam, _d, _s = classify(hp(m))
            if fam and fam != "glibc":
                preloads.append((m, "LD_PRELOAD", "inferred: mapped, but no loaded object "
                                                  "links it and the load order is unknown"))
                notes.append(f"{m} is mapped but linked by nothing; taken as preloaded (it "
                             "could also have been dlopen()ed; run as root to read the "
                             "loader's own list)")
    if pos:
        preloads.sort(key=lambda p: (p[1] != "LD_PRELOAD", pos.get(p[0], 1 << 30)))

    scope: list[LoadedObject] = []
    fam_exe, kind_exe = static_allocator(hp(exe))
    exe_elf = open_elf(hp(exe))
    exe_defines = False
    if exe_elf is not None:
        exe_defines = "malloc" in exe_elf.defined_symbols("dynsym", {"malloc"}) or (
            exe_elf.is_static and kind_exe == "unprefixed")
    scope.append(LoadedObject(exe, fam_exe if kind_exe == "unprefixed" else None,
                              exe_defines, "executable"))
    evidence = {}
    for m, how, ev in preloads:
        fam, defines, _ = classify(hp(m))
        scope.append(LoadedObject(m, fam, defines, how))
        evidence[m] = ev
    for m, via in closure.items():
        if m not in named and m not in evidence:
            fam, defines, _ = classify(hp(m))
            scope.append(LoadedObject(m, fam, defines, "linked", via))
    if pos:
        # The load order is the lookup order, preloads and linked libraries alike (a
        # library the program links can be loaded, and so searched, ahead of the others).
        # Objects it does not show keep their place: preloads first, linked ones last.
        scope[1:] = sorted(scope[1:], key=lambda o: pos.get(
            o.path, -1 if o.how in ("LD_PRELOAD", "ld.so.preload") else 1 << 30))
    extra = []
    for m in dlopened:
        fam, defines, _ = classify(hp(m))
        extra.append(LoadedObject(m, fam, defines, "dlopen"))

    provider = next((o for o in scope if o.defines_malloc), None)
    res = WhichResult(pid=pid, exe=exe, cmdline=None, allocator="unknown", library=None,
                      how="none", detail="", ld_preload=ld_preload,
                      notes=list(dict.fromkeys(notes)))
    if provider is None:
        res.detail = "no loaded object defines malloc (not a C program?)"
    else:
        fam = provider.family or "unknown"
        res.allocator = fam
        if provider.how == "executable":
            res.how = "static"
            res.detail = (f"{fam} is compiled into the executable, which defines malloc "
                          f"itself; LD_PRELOAD cannot replace it")
        else:
            real = hp(provider.path)
            res.library = os.path.realpath(real) if os.path.exists(real) else provider.path
            res.how = provider.how
            if provider.how == "LD_PRELOAD":
                res.detail = f"preloaded through LD_PRELOAD ({evidence[provider.path]})"
            elif provider.how == "ld.so.preload":
                res.detail = "preloaded system-wide by /etc/ld.so.preload"
            elif fam == "glibc":
                res.detail = "the C library's own malloc (nothing preloaded or linked overrides it)"
            else:
                via = os.path.basename(provider.via) if provider.via else "the program"
                res.detail = f"linked: a DT_NEEDED dependency of {via}"
    if kind_exe == "prefixed" and fam_exe:
        res.own_allocator = (
            f"{fam_exe}, compiled into the executable under prefixed names (e.g. "
            f"je_malloc): the program's own allocations use it regardless of LD_PRELOAD; "
            f"{res.allocator} serves only what libc and other libraries allocate")
    for o in scope + extra:
        if o is provider or not o.family or o.family == "glibc" or o.how == "executable":
            continue
        if o.how == "dlopen":
            why = "loaded with dlopen(): not used for the program's malloc/free"
        elif provider is not None and scope.index(o) > scope.index(provider):
            own = {"jemalloc": "mallctl", "keel": "keel_stats_get", "tcmalloc":
                   "MallocExtension", "mimalloc": "mi_malloc"}.get(o.family, "its own API")
            why = (f"comes after {res.allocator} in the lookup order, so its malloc/free are "
                   f"not used; only the functions no earlier object defines ({own}...) are")
        else:
            why = "does not define malloc"
        res.others.append({"family": o.family, "path": o.path, "how": o.how, "why": why})
    return res


# ---------------------------------------------------------------------------------
# commands


def _ldd_objects(exe: str, interp: str, env: dict) -> Optional[list[str]]:
    """Objects in load order, as the loader would load them under env (LD_PRELOAD
    included), via LD_TRACE_LOADED_OBJECTS (what ldd does). The loader `interp` (glibc's,
    the executable's PT_INTERP) is run with the executable as its argument: it lists the
    objects and exits, and the executable itself is never started (nor setuid applied).
    Callers make sure interp is glibc's loader: another one could ignore the variable
    and run the program."""
    tenv = dict(env)
    tenv["LD_TRACE_LOADED_OBJECTS"] = "1"
    try:
        r = subprocess.run([interp, exe], env=tenv, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = []
    for line in r.stdout.splitlines():
        m = re.match(r"\s*(\S+)(?: => (\S+))? \(0x", line)
        if not m:
            continue
        path = m.group(2) or m.group(1)
        if path.startswith("/"):
            out.append(path)
    return out or None


def _resolve_cmd(cmd: list[str], env: dict) -> str:
    import shutil
    exe = cmd[0] if "/" in cmd[0] else shutil.which(cmd[0], path=env.get("PATH"))
    if not exe or not os.path.exists(exe):
        raise WhichError(f"command not found: {cmd[0]}")
    if not os.access(exe, os.X_OK):
        raise WhichError(f"{exe} is not executable")
    return os.path.realpath(exe)


def predict_command(cmd: list[str], env: Optional[dict] = None) -> WhichResult:
    """Which allocator cmd would use, without running it: a dynamic executable's load
    order comes from its loader (LD_TRACE_LOADED_OBJECTS, what ldd does), a static one is
    judged from its own symbols and never executed."""
    env = dict(os.environ if env is None else env)
    exe = _resolve_cmd(cmd, env)
    elf = open_elf(exe)
    if elf is None:
        raise WhichError(f"{exe} is not an ELF executable (a script? point keel which at "
                         f"the program it runs, or run it and use keel which PID)")
    ld_preload = env.get("LD_PRELOAD", "")
    interp = elf.interp
    if interp is None:
        res = analyze(exe, [], "")
        res.ld_preload = ld_preload
        res.notes.append("static executable (no program interpreter): judged from its own "
                         "symbols, not by running it; it loads no shared objects, so "
                         "LD_PRELOAD and /etc/ld.so.preload do not apply")
    elif not (GLIBC_LOADER_RE.match(os.path.basename(interp)) and os.path.exists(interp)):
        res = analyze(exe, [], ld_preload)
        res.notes.append(f"its program interpreter {interp} is not glibc's dynamic loader "
                         "(or is missing): not run, so the libraries it would load are unknown")
    else:
        objs = _ldd_objects(exe, interp, env) or []
        res = analyze(exe, objs, ld_preload, order=objs, order_source="ldd")
    res.method = "predicted"
    res.cmdline = " ".join(cmd)
    return res


class Terminated(BaseException):
    """keel which got SIGTERM (or SIGHUP) while it inspected a command: the command and
    what it started were stopped; the caller exits."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37


def _subreaper(on: Optional[bool]) -> Optional[bool]:
    """prctl(PR_SET_CHILD_SUBREAPER): while set, a process that a descendant of ours
    leaves behind (a daemon that forked and let its parent exit, a child that called
    setsid) is re-parented to us instead of to init, so it can still be found and
    stopped. Returns the previous setting (None if unknown); on=None only reads it."""
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        cur = ctypes.c_int(0)
        prev = bool(cur.value) if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(cur), 0, 0,
                                             0) == 0 else None
        if on is not None:
            libc.prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0)
        return prev
    except (OSError, AttributeError):
        return None


def _children_of_me() -> set[int]:
    import psutil
    try:
        return {c.pid for c in psutil.Process().children()}
    except psutil.Error:
        return set()


def _started_by(p: subprocess.Popen, before: set[int], since: Optional[float]) -> list[int]:
    """Processes that descend from the started command, oldest first: its own
    descendants while it runs, and (re-parented to us as a subreaper) those it left
    behind -- our children that did not exist before it started (`before`) and that
    started no earlier than it did (`since`, psutil's create_time)."""
    import psutil
    kids: dict[int, list[tuple[float, int]]] = {}
    for proc in psutil.process_iter(["pid", "ppid", "create_time"]):
        i = proc.info
        if i["ppid"] is None or i["pid"] == p.pid:
            continue
        kids.setdefault(i["ppid"], []).append((i["create_time"] or 0.0, i["pid"]))
    me = os.getpid()
    out: list[tuple[float, int]] = []
    seen: set[int] = set()
    queue = deque([p.pid, me])
    while queue:
        cur = queue.popleft()
        for ct, pid in kids.get(cur, []):
            if pid in seen:
                continue
            if cur == me and (pid in before or (since is not None and ct < since)):
                continue
            seen.add(pid)
            out.append((ct, pid))
            queue.append(pid)
    return [pid for _ct, pid in sorted(out)]


def _stop_all(p: subprocess.Popen, before: set[int], since: Optional[float]) -> None:
    """Stops the command (its process group) and everything it started that left the
    group (daemons, setsid children), by their own PIDs; reaps those that are ours."""
    left = _started_by(p, before, since) if p.poll() is None else []
    procs.stop(p)
    left = list(dict.fromkeys(left + _started_by(p, before, since)))
    if left:
        procs.kill_pids(left, signals=(signal.SIGTERM, signal.SIGKILL), wait=3.0)
    for pid in left:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        except OSError:
            pass


def inspect_command(cmd: list[str], wait: float = 0.5, env: Optional[dict] = None) -> WhichResult:
    """Starts cmd, inspects it after `wait` seconds, stops it: its whole process group,
    then whatever it started outside the group (a daemon: `redis-server --daemonize yes`,
    a child in its own session), found through the subreaper. A command that exits
    leaving a process behind (it daemonised) is inspected through that process.
    SIGTERM or SIGHUP to keel meanwhile stops them too, then raises Terminated."""
    import threading
    env = dict(os.environ if env is None else env)
    _resolve_cmd(cmd, env)     # a clear error for a missing or non-executable command

    old_handlers: dict[signal.Signals, Any] = {}
    prev_reaper = _subreaper(None)
    try:
        if threading.current_thread() is threading.main_thread():
            def on_signal(signum, _frame):
                raise Terminated(signum)
            for sig in (signal.SIGTERM, signal.SIGHUP):
                old_handlers[sig] = signal.signal(sig, on_signal)
        if prev_reaper is False:
            _subreaper(True)
        before = _children_of_me()
        with tempfile.TemporaryFile() as errf:
            try:
                p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=errf,
                                     start_new_session=True, preexec_fn=procs.pdeathsig)
            except OSError as e:
                raise WhichError(f"cannot start {cmd[0]}: {e}") from None
            since = None
            try:
                import psutil
                since = psutil.Process(p.pid).create_time()
            except Exception:
                pass
            try:
                deadline = time.monotonic() + wait
                while time.monotonic() < deadline:
                    if p.poll() is not None and not _started_by(p, before, since):
                        break
                    time.sleep(0.02 if p.poll() is None else 0.1)
                res = None
                if p.poll() is None:
                    try:
                        res = inspect_pid(p.pid)
                    except WhichError:
                        if p.poll() is None:
                            raise
                if res is None and p.poll() is not None:
                    for pid in _started_by(p, before, since):
                        if not procfs.pid_running(pid):
                            continue
                        try:
                            res = inspect_pid(pid)
                        except WhichError:
                            continue
                        res.notes.append(
                            f"the command exited ({procs.describe_exit(p.returncode)}) and left "
                            f"PID {pid} running (it daemonised): that process was inspected, "
                            "then stopped")
                        break
                if res is None:
                    errf.seek(0)
                    err = errf.read().decode("utf-8", "replace").strip()
                    res = predict_command(cmd, env)
                    res.notes.append(f"the command exited (status {p.returncode}) before it "
                                     "could be inspected" +
                                     (f": {err.splitlines()[-1]}" if err else ""))
                elif res.pid == p.pid:
                    res.cmdline = " ".join(cmd)
                return res
            finally:
                # a second SIGTERM must not cut the clean-up short
                for sig in old_handlers:
                    signal.signal(sig, signal.SIG_IGN)
                _stop_all(p, before, since)
    finally:
        if prev_reaper is False:
            _subreaper(False)
        for sig, h in old_handlers.items():
            signal.signal(sig, h)
