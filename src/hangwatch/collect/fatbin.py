"""The CUDA fat-binary boundary: which GPU architectures a shared object carries code for.

A pure-Python ELF reader, made for one question: what SASS targets and PTX versions are
embedded in a library, so that doctor can tell before launch whether a GPU can run it. Only
headers are read (through ``mmap``, so a 1.5 GB ``libtorch_cuda.so`` costs page faults, not
a read of the file), and compressed payloads are never decompressed: the entry header says
everything needed.

Layout (NVIDIA does not publish it; these are the fields observed in nvcc 13.0 output and
described alike by the open readers of the format):

* ELF sections ``.nv_fatbin`` (what the CUDA runtime registers when the library loads) and
  ``__nv_relfatbin`` (device code kept for a later device link, ``-rdc``). A library stripped of
  its section headers is searched through its ``PT_LOAD`` segments instead.
* Each holds containers: ``u32 magic 0xBA55ED50, u16 version 1, u16 header size, u64 size``.
* Each container holds entries, each with a header of at least 64 bytes:
  ``u16 kind (1 PTX, 2 ELF/SASS), u16 version 0x0101, u32 header size, u64 payload size,
  u32 compressed size, u32 -, u16 minor, u16 major (the PTX ISA version of a PTX entry),
  u32 arch (90 for sm_90), u32 name offset, u32 name size, u64 flags, u64 -, u64 uncompressed size``.
* Flags: 0x1 64-bit, 0x2 debug, 0x10 Linux, 0x1000/0x2000 LZ4-compressed, 0x8000 zstd-compressed
  (the default for PTX since CUDA 13), 0x100000 arch-specific (``sm_90a``), 0x200000
  family-specific (``sm_100f``).

Errors never leave this module: a file that is not a 64-bit little-endian ELF, or a damaged
structure, becomes ``ModuleScan.unreadable`` or a line in ``ModuleScan.problems``.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from pathlib import Path

from hangwatch.model.doctor import EntryKind
from hangwatch.model.doctor import FatbinContainer
from hangwatch.model.doctor import FatbinEntry
from hangwatch.model.doctor import ModuleScan

FATBIN_MAGIC = 0xBA55ED50
_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)
_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")  # 64 bytes
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")

FLAG_LZ4 = 0x1000 | 0x2000
FLAG_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY_SPECIFIC = 0x200000

_KINDS = {1: EntryKind.PTX, 2: EntryKind.SASS}
_MAX_PROBLEMS = 20
_MAX_ENTRY_HEADER = 4096
_PT_LOAD = 1
_SHT_NOBITS = 8


class _DamagedError(Exception):
    """A structure whose fields point outside the file: the reason is the message."""


def read_fatbins(path: str | Path) -> ModuleScan:
    """Every fatbin container of the ELF file at ``path``; never raises."""
    started = time.monotonic()
    name = str(path)
    try:
        with Path(path).open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 64:
                return ModuleScan(
                    name, unreadable=f"not an ELF file ({size} bytes)", seconds=time.monotonic() - started
                )
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                scan = _scan(name, mm)
    except (OSError, ValueError) as exc:
        return ModuleScan(name, unreadable=f"cannot read: {exc}", seconds=time.monotonic() - started)
    return ModuleScan(scan.path, scan.containers, scan.problems, scan.unreadable, time.monotonic() - started)


_MAX_SECTIONS = 65536


def section_names(path: str | Path) -> set[str] | None:
    """The ELF section names of the file at ``path``, reading its headers only (a few kB with ``pread``,
    whatever the file's size); None when it has no section headers (stripped: only a full scan of its
    segments can tell), an empty set for a file that is not a 64-bit little-endian ELF or is damaged."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return set()
    try:
        head = os.pread(fd, 64, 0)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return set()
        (shoff,) = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
        if shoff == 0:
            return None
        if shnum == 0 or shstrndx == 0xFFFF:  # extended numbering: counts in section 0
            first = os.pread(fd, 64, shoff)
            if len(first) < 64:
                return set()
            shnum = shnum or struct.unpack_from("<Q", first, 0x20)[0]
            shstrndx = struct.unpack_from("<I", first, 0x28)[0] if shstrndx == 0xFFFF else shstrndx
        if shentsize < 64 or not 0 < shnum <= _MAX_SECTIONS or shstrndx >= shnum:
            return set()
        table = os.pread(fd, shnum * shentsize, shoff)
        if len(table) < shnum * shentsize:
            return set()
        str_off, str_size = struct.unpack_from("<QQ", table, shstrndx * shentsize + 0x18)
        names = os.pread(fd, min(str_size, 1 << 20), str_off)
        out = set()
        for i in range(shnum):
            name_off, _type, _flags, _addr, _off, sec_size = struct.unpack_from(
                "<IIQQQQ", table, i * shentsize
            )
            if sec_size and name_off < len(names):
                end = names.find(b"\0", name_off)
                out.add(names[name_off : end if end >= 0 else len(names)].decode("ascii", "replace"))
        return out
    except (OSError, struct.error):
        return set()
    finally:
        os.close(fd)


def carries_device_code(path: str | Path) -> bool:
    """Whether a shared object may hold CUDA device code: a ``.nv_fatbin``/``__nv_relfatbin`` section,
    or no section headers at all (then only :func:`read_fatbins` can tell). Headers only: cheap."""
    names = section_names(path)
    return names is None or bool(names & set(FATBIN_SECTIONS))


def read_fatbins_from_bytes(data: bytes, name: str = "<bytes>") -> ModuleScan:
    """The same reader over bytes already in memory (tests, and fat binaries outside a file)."""
    return _scan(name, data)


def _scan(name: str, buf: bytes | mmap.mmap) -> ModuleScan:
    try:
        regions = _regions(buf)
    except (_DamagedError, struct.error, IndexError, ValueError, UnicodeDecodeError) as exc:
        return ModuleScan(name, unreadable=str(exc) or type(exc).__name__)
    containers: list[FatbinContainer] = []
    problems: list[str] = []
    for section, start, end, scanned in regions:
        parse_containers(buf, section, start, end, out=containers, problems=problems, resync=scanned)
    return ModuleScan(name, tuple(containers), tuple(problems[:_MAX_PROBLEMS]))


def _regions(buf: bytes | mmap.mmap) -> list[tuple[str, int, int, bool]]:
    """(section name, start, end, found by scanning) of the places fat binaries live."""
    if buf[:4] != b"\x7fELF":
        raise _DamagedError("not an ELF file")
    if buf[4] != 2:
        raise _DamagedError("a 32-bit ELF file: only 64-bit libraries carry CUDA code this reader knows")
    if buf[5] != 1:
        raise _DamagedError("a big-endian ELF file: not supported")
    size = len(buf)
    phoff, shoff = struct.unpack_from("<QQ", buf, 0x20)
    phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", buf, 0x36)
    sections = _sections(buf, size=size, shoff=shoff, shentsize=shentsize, shnum=shnum, shstrndx=shstrndx)
    if sections is not None:
        return [
            (sec_name, off, off + sec_size, False)
            for sec_name, sec_type, off, sec_size in sections
            if sec_name in FATBIN_SECTIONS and sec_type != _SHT_NOBITS and sec_size > 0
        ]
    # No section headers (stripped with sstrip, or damaged): search the loaded segments.
    regions = []
    for i in range(phnum):
        at = phoff + i * phentsize
        if phentsize < 56 or at + 56 > size:
            raise _DamagedError("program headers point outside the file")
        p_type, _flags, p_offset, _vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", buf, at)
        if p_type == _PT_LOAD and p_filesz and p_offset + p_filesz <= size:
            regions.append(("segment", p_offset, p_offset + p_filesz, True))
    return regions


def _sections(
    buf: bytes | mmap.mmap, *, size: int, shoff: int, shentsize: int, shnum: int, shstrndx: int
) -> list[tuple[str, int, int, int]] | None:
    """(name, type, offset, size) of each section, or None when the file has no section headers."""
    if shoff == 0:
        return None
    if shentsize < 64 or shoff + 64 > size:
        raise _DamagedError("section headers point outside the file")
    if shnum == 0:  # extended numbering: the count is in section 0's size field
        shnum = struct.unpack_from("<Q", buf, shoff + 0x20)[0]
    if shstrndx == 0xFFFF:
        shstrndx = struct.unpack_from("<I", buf, shoff + 0x28)[0]
    if shnum == 0 or shoff + shnum * shentsize > size or shstrndx >= shnum:
        raise _DamagedError("section header table is truncated")
    raw = []
    for i in range(shnum):
        name_off, sec_type, _flags, _addr, off, sec_size = struct.unpack_from(
            "<IIQQQQ", buf, shoff + i * shentsize
        )
        raw.append((name_off, sec_type, off, sec_size))
    str_off, str_size = raw[shstrndx][2], raw[shstrndx][3]
    if str_off + str_size > size:
        raise _DamagedError("section name table points outside the file")
    names = bytes(buf[str_off : str_off + str_size])
    out = []
    for name_off, sec_type, off, sec_size in raw:
        end = names.find(b"\0", name_off)
        name = names[name_off : end if end >= 0 else len(names)].decode("ascii", "replace")
        if sec_type != _SHT_NOBITS and off + sec_size > size:
            if name in FATBIN_SECTIONS:
                raise _DamagedError(f"section {name} runs past the end of the file (truncated download?)")
            continue
        out.append((name, sec_type, off, sec_size))
    return out


def parse_containers(
    buf: bytes | mmap.mmap,
    section: str,
    start: int,
    end: int,
    *,
    out: list[FatbinContainer],
    problems: list[str],
    resync: bool = False,
) -> None:
    """Append the containers found in ``buf[start:end]``.

    Containers follow each other, 8-byte aligned. A damaged one is reported and the search
    goes on at the next magic number; in a segment (``resync``), magic numbers are searched for
    from the start, since other data surrounds the fat binaries there.
    """
    pos = start
    while pos + _CONTAINER.size <= end:
        found = buf.find(_MAGIC_BYTES, pos, end)
        if found < 0:
            if not resync and any(buf[pos:end]):
                problems.append(
                    f"{section}+{pos - start:#x}: {end - pos} bytes that are not a fatbin container"
                )
            return
        if found % 8:  # containers are 8-byte aligned: a stray match inside other data
            pos = found + 1
            continue
        _magic, version, header_size, fat_size = _CONTAINER.unpack_from(buf, found)
        body = found + header_size
        if version != 1 or header_size < _CONTAINER.size or body + fat_size > end:
            if not resync:
                problems.append(
                    f"{section}+{found - start:#x}: container header (version {version}, header "
                    f"{header_size} B, "
                    f"size {fat_size} B) does not fit the section; skipped"
                )
            pos = found + 8
            continue
        entries = _parse_entries(buf, section, body, body + fat_size, base=start, problems=problems)
        out.append(FatbinContainer(section, found, tuple(entries)))
        pos = body + fat_size


def _parse_entries(
    buf: bytes | mmap.mmap, section: str, start: int, end: int, *, base: int, problems: list[str]
) -> list[FatbinEntry]:
    entries: list[FatbinEntry] = []
    q = start
    while q < end:
        if end - q < _ENTRY.size:
            if any(buf[q:end]):
                problems.append(f"{section}+{q - base:#x}: {end - q} bytes left, too few for an entry header")
            break
        (
            kind,
            _version,
            header_size,
            payload_size,
            _csize,
            _u2,
            minor,
            major,
            arch,
            _name_off,
            _name_len,
            flags,
            _zero,
            _dsize,
        ) = _ENTRY.unpack_from(buf, q)
        if (
            header_size < _ENTRY.size
            or header_size > _MAX_ENTRY_HEADER
            or q + header_size + payload_size > end
        ):
            problems.append(
                f"{section}+{q - base:#x}: entry header (header {header_size} B, payload {payload_size} B) "
                "does not fit its container; rest of the container skipped"
            )
            break
        entries.append(entry_from_header(kind, arch, flags, major=major, minor=minor, size=payload_size))
        q += header_size + payload_size
    return entries


def entry_from_header(kind: int, arch: int, flags: int, *, major: int, minor: int, size: int) -> FatbinEntry:
    entry_kind = _KINDS.get(kind, EntryKind.OTHER)
    if flags & FLAG_ARCH_SPECIFIC:
        variant = "a"
    elif flags & FLAG_FAMILY_SPECIFIC:
        variant = "f"
    else:
        variant = ""
    if flags & FLAG_ZSTD:
        compression: str | None = "zstd"
    elif flags & FLAG_LZ4:
        compression = "lz4"
    else:
        compression = None
    return FatbinEntry(
        kind=entry_kind,
        arch=arch,
        variant=variant,
        ptx_version=f"{major}.{minor}" if entry_kind is EntryKind.PTX else None,
        compression=compression,
        size=size,
    )
