"""A small read-only ELF reader: DT_NEEDED, DT_SONAME and defined symbols.

Pure Python (no readelf needed), enough to tell which allocator a program or library
carries: it reads the dynamic section through the program headers (works on stripped
files) and the symbol tables through the section headers.
"""
from __future__ import annotations

import mmap
import struct
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Optional

ELF_MAGIC = b"\x7fELF"
PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
SHT_SYMTAB, SHT_DYNSYM = 2, 11
DT_NULL, DT_NEEDED, DT_STRTAB, DT_SONAME, DT_STRSZ = 0, 1, 5, 14, 10
SHN_UNDEF = 0
STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 1, 2, 10


class ElfError(Exception):
    pass


class Elf:
    """Parses lazily; every accessor returns empty results rather than raising on odd
    but valid files. Raises ElfError for a file that is not ELF at all."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        with open(self.path, "rb") as f:
            try:
                self._data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as err:  # empty file
                raise ElfError(f"{self.path}: not an ELF file ({err})") from None
        d = self._data
        if len(d) < 52 or d[:4] != ELF_MAGIC:
            raise ElfError(f"{self.path}: not an ELF file")
        self.is64 = d[4] == 2
        self.end = "<" if d[5] == 1 else ">"
        e = self.end
        if self.is64:
            (self.type, self.machine, _v, _entry, self.phoff, self.shoff, _fl, _ehs,
             self.phentsize, self.phnum, self.shentsize, self.shnum, self.shstrndx) = \
                struct.unpack_from(e + "HHIQQQIHHHHHH", d, 16)
        else:
            (self.type, self.machine, _v, _entry, self.phoff, self.shoff, _fl, _ehs,
             self.phentsize, self.phnum, self.shentsize, self.shnum, self.shstrndx) = \
                struct.unpack_from(e + "HHIIIIIHHHHHH", d, 16)
        self._dyn: Optional[dict] = None

    def close(self) -> None:
        try:
            self._data.close()
        except (BufferError, ValueError):
            pass

    # -- program headers ------------------------------------------------------------
    def _phdrs(self) -> list[tuple[int, int, int, int]]:
        """[(type, offset, vaddr, filesz)]"""
        out = []
        d, e = self._data, self.end
        for i in range(self.phnum):
            off = self.phoff + i * self.phentsize
            if off + self.phentsize > len(d):
                break
            if self.is64:
                p_type, _fl, p_off, p_vaddr, _pa, p_filesz, _mem, _al = struct.unpack_from(
                    e + "IIQQQQQQ", d, off)
            else:
                p_type, p_off, p_vaddr, _pa, p_filesz, _mem, _fl, _al = struct.unpack_from(
                    e + "IIIIIIII", d, off)
            out.append((p_type, p_off, p_vaddr, p_filesz))
        return out

    def _vaddr_to_off(self, vaddr: int) -> Optional[int]:
        for t, off, va, sz in self._phdrs():
            if t == PT_LOAD and va <= vaddr < va + sz:
                return off + (vaddr - va)
        return None

    def _cstr(self, off: int) -> str:
        end = self._data.find(b"\0", off)
        if end < 0:
            end = len(self._data)
        return self._data[off:end].decode("utf-8", "replace")

    @property
    def interp(self) -> Optional[str]:
        for t, off, _va, sz in self._phdrs():
            if t == PT_INTERP:
                return self._data[off:off + sz].rstrip(b"\0").decode("utf-8", "replace")
        return None

    def _dynamic(self) -> dict:
        if self._dyn is not None:
            return self._dyn
        res: dict = {"needed": [], "soname": None}
        d, e = self._data, self.end
        dyn = [(off, sz) for t, off, _va, sz in self._phdrs() if t == PT_DYNAMIC]
        if dyn:
            off, sz = dyn[0]
            entsz = 16 if self.is64 else 8
            fmt = e + ("qQ" if self.is64 else "iI")
            entries = []
            for i in range(sz // entsz):
                if off + (i + 1) * entsz > len(d):
                    break
                tag, val = struct.unpack_from(fmt, d, off + i * entsz)
                if tag == DT_NULL:
                    break
                entries.append((tag, val))
            strtab = next((v for t, v in entries if t == DT_STRTAB), None)
            stroff = self._vaddr_to_off(strtab) if strtab is not None else None
            if stroff is not None:
                for t, v in entries:
                    if t == DT_NEEDED:
                        res["needed"].append(self._cstr(stroff + v))
                    elif t == DT_SONAME:
                        res["soname"] = self._cstr(stroff + v)
        self._dyn = res
        return res

    @property
    def needed(self) -> list[str]:
        return list(self._dynamic()["needed"])

    @property
    def soname(self) -> Optional[str]:
        return self._dynamic()["soname"]

    @property
    def is_dynamic(self) -> bool:
        return any(t == PT_DYNAMIC for t, *_ in self._phdrs())

    @property
    def is_static(self) -> bool:
        """For an executable: no program interpreter (PT_INTERP), so no dynamic loader
        runs and nothing is loaded at start: static, or static-pie (which still has a
        PT_DYNAMIC for its own relocations, so is_dynamic does not tell)."""
        return self.interp is None

    # -- sections and symbols ---------------------------------------------------------
    def _sections(self) -> list[tuple[int, int, int, int, int]]:
        """[(type, offset, size, link, entsize)]"""
        out: list[tuple[int, int, int, int, int]] = []
        d, e = self._data, self.end
        if not self.shoff or not self.shnum:
            return out
        for i in range(self.shnum):
            off = self.shoff + i * self.shentsize
            if off + self.shentsize > len(d):
                break
            if self.is64:
                _n, t, _f, _a, s_off, s_size, link, _info, _al, entsz = struct.unpack_from(
                    e + "IIQQQQIIQQ", d, off)
            else:
                _n, t, _f, _a, s_off, s_size, link, _info, _al, entsz = struct.unpack_from(
                    e + "IIIIIIIIII", d, off)
            out.append((t, s_off, s_size, link, entsz))
        return out

    def defined_symbols(self, table: str = "dynsym",
                        interesting: Optional[Iterable[str]] = None) -> set[str]:
        """Names of the global/weak symbols the file defines, from .dynsym ("dynsym":
        what it exports to other objects) or .symtab ("symtab": absent when stripped).
        With `interesting`, only those names are returned (faster on big tables)."""
        want_type = SHT_DYNSYM if table == "dynsym" else SHT_SYMTAB
        wanted = set(interesting) if interesting is not None else None
        wanted_b = {w.encode() for w in wanted} if wanted is not None else None
        secs = self._sections()
        d, e = self._data, self.end
        out: set[str] = set()
        for t, off, size, link, entsz in secs:
            if t != want_type or link >= len(secs):
                continue
            _t, str_off, str_size, _l, _es = secs[link]
            entsz = entsz or (24 if self.is64 else 16)
            n = size // entsz
            for i in range(1, n):
                p = off + i * entsz
                if p + entsz > len(d):
                    break
                if self.is64:
                    name, info, _other, shndx = struct.unpack_from(e + "IBBH", d, p)
                else:
                    name, _val, _sz, info, _other, shndx = struct.unpack_from(e + "IIIBBH", d, p)
                if shndx == SHN_UNDEF or (info >> 4) not in (STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE):
                    continue
                s = str_off + name
                if s >= len(d):
                    continue
                end = d.find(b"\0", s, str_off + str_size)
                raw = d[s:end if end >= 0 else str_off + str_size]
                if wanted_b is not None:
                    if raw in wanted_b:
                        out.add(raw.decode())
                else:
                    out.add(raw.decode("utf-8", "replace"))
        return out

    def symbol_value(self, wanted: str, table: str = "dynsym") -> Optional[int]:
        """st_value of a defined symbol (its address relative to the load base)."""
        want_type = SHT_DYNSYM if table == "dynsym" else SHT_SYMTAB
        wb = wanted.encode()
        secs = self._sections()
        d, e = self._data, self.end
        for t, off, size, link, entsz in secs:
            if t != want_type or link >= len(secs):
                continue
            str_off = secs[link][1]
            entsz = entsz or (24 if self.is64 else 16)
            for i in range(1, size // entsz):
                p = off + i * entsz
                if p + entsz > len(d):
                    break
                if self.is64:
                    name, _info, _other, shndx, value = struct.unpack_from(e + "IBBHQ", d, p)
                else:
                    name, value, _sz, _info, _other, shndx = struct.unpack_from(e + "IIIBBH", d, p)
                if shndx == SHN_UNDEF:
                    continue
                s = str_off + name
                if d[s:s + len(wb) + 1] == wb + b"\0":
                    return value
        return None

    def first_load_vaddr(self) -> int:
        return min((va - off for t, off, va, _sz in self._phdrs() if t == PT_LOAD), default=0)

    def contains(self, needle: bytes) -> bool:
        return self._data.find(needle) >= 0


def is_elf(path: str | Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == ELF_MAGIC
    except OSError:
        return False


@lru_cache(maxsize=512)
def _cached(path: str, mtime_ns: int, size: int) -> Optional[Elf]:
    try:
        return Elf(path)
    except (OSError, ElfError):
        return None


def open_elf(path: str | Path) -> Optional[Elf]:
    """An Elf for path (cached per path and mtime), or None if unreadable / not ELF."""
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return _cached(str(path), st.st_mtime_ns, st.st_size)
