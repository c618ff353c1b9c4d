"""Minimal 64-bit ELF shared objects crafted in a test, with or without a ``.nv_fatbin`` section
(imported by tests as ``elfcraft``). For machines without nvcc: the layout follows what nvcc writes
(collect/fatbin.py describes it), one container with one SASS entry per target."""

from __future__ import annotations

import struct

_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")
_SECTION = struct.Struct("<IIQQQQIIQQ")
FLAG_64BIT_LINUX = 0x1 | 0x10
FLAG_ARCH_SPECIFIC = 0x100000


def fatbin(archs: list[int], arch_specific: bool = False) -> bytes:
    """One fatbin container holding a SASS entry (16 payload bytes) per ``sm_XY`` in ``archs``."""
    flags = FLAG_64BIT_LINUX | (FLAG_ARCH_SPECIFIC if arch_specific else 0)
    entries = b"".join(
        _ENTRY.pack(2, 0x0101, _ENTRY.size, 16, 0, 0, 0, 0, arch, 0, 0, flags, 0, 16) + b"\xaa" * 16
        for arch in archs
    )
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(entries)) + entries


def shared_object(sections: dict[str, bytes], strip_section_headers: bool = False) -> bytes:
    """An ELF64 little-endian ET_DYN file with these sections (and .shstrtab), no segments."""
    names = b"\0"
    offsets: list[tuple[int, int, int]] = []  # (name offset, data offset, size)
    body = b""
    start = 64
    for name, data in sections.items():
        offsets.append((len(names), start + len(body), len(data)))
        names += name.encode() + b"\0"
        body += data + b"\0" * (-len(data) % 8)
    shstr_name = len(names)
    names += b".shstrtab\0"
    shstr_off = start + len(body)
    body += names + b"\0" * (-len(names) % 8)
    shoff = start + len(body)
    table = _SECTION.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    for name_off, off, size in offsets:
        table += _SECTION.pack(name_off, 1, 0x2, 0, off, size, 0, 0, 8, 0)  # PROGBITS, ALLOC
    table += _SECTION.pack(shstr_name, 3, 0, 0, shstr_off, len(names), 0, 0, 1, 0)  # STRTAB
    shnum = len(sections) + 2
    header = b"\x7fELF\x02\x01\x01" + b"\0" * 9 + struct.pack(
        "<HHIQQQIHHHHHH",
        3, 62, 1, 0, 0, 0 if strip_section_headers else shoff, 0, 64, 56, 0, 64, shnum, shnum - 1,
    )  # fmt: skip
    return header + body + table


def cuda_module(archs: list[int], arch_specific: bool = False) -> bytes:
    return shared_object({".text": b"\x90" * 32, ".nv_fatbin": fatbin(archs, arch_specific)})


def host_module() -> bytes:
    return shared_object({".text": b"\x90" * 32, ".data": b"host only"})
