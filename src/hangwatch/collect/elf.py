"""ELF files as the native unwinder reads them: load segments, the ``.eh_frame_hdr`` search table, the
call-frame information (CFI) row that says how to find a function's caller, and function names.

Why our own reader: ``py-spy dump --native`` spends nearly all of its 0.1-2 s a process loading the symbol
tables of every library a stack touches (530,000 symbols in torch's CPU library alone, sorted and
demangled), again for every process and every round (docs/stacks.md, "Native frames"). An ``ElfFile`` is
opened once per file and shared by every process that maps it: its CFI rows and function names are kept
as they are looked up, and the symbol table is scanned only for the function starts a stack needs, never
sorted or kept whole.

Only little-endian ELF64 is read (x86_64 is what the unwinder supports); anything else is refused with a
reason, and the caller falls back to py-spy's own unwinding.
"""

from __future__ import annotations

import bisect
import mmap
import operator
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

EM_X86_64 = 62
_PT_LOAD = 1
_PF_X = 1
PAGE = 4096
_PT_GNU_EH_FRAME = 0x6474E550
_SHT_SYMTAB = 2
_SHT_DYNSYM = 11
_STT_FUNC = 2
_STT_GNU_IFUNC = 10
_SYM_SIZE = 24
# x86_64's DWARF register numbers: rbx, rbp, rsp, r12-r15 are callee-saved; 16 is the return address.
RSP = 7
RA = 16


class ElfError(Exception):
    """A file the unwinder cannot read: not ELF64 little-endian, truncated, or without a search table."""


@dataclass(frozen=True)
class Rule:
    """How to recover one register in the caller. kind: ``offset`` (saved at CFA + n), ``val_offset`` (is
    CFA + n), ``register`` (held in register n), ``expression`` / ``val_expression`` (a DWARF expression
    whose result is the address of the saved value / the value), ``undefined``."""

    kind: str
    value: int = 0
    expr: bytes = b""


@dataclass(frozen=True)
class Row:
    """One CFI row: the canonical frame address (CFA) is a register plus an offset, or an expression; the
    rules say where the caller's registers are. ``start``: the function's first address (the FDE's)."""

    start: int
    cfa_reg: int
    cfa_offset: int
    cfa_expr: bytes
    rules: tuple[tuple[int, Rule], ...]
    # A signal trampoline's frame ('S'): the frame below was interrupted, not calling, so its pc is
    # exact (looked up as is, not one byte before).
    signal: bool = False


@dataclass(frozen=True)
class _Cie:
    code_align: int
    data_align: int
    ra_reg: int
    fde_encoding: int
    has_z: bool
    initial: bytes
    signal: bool


# DW_EH_PE_absptr, udata2/4/8, sdata2/4/8: the fixed-width pointer formats (uleb128 and sleb128 aside).
_POINTER_FORMATS = {0x00: "<Q", 0x02: "<H", 0x03: "<I", 0x04: "<Q", 0x0A: "<h", 0x0B: "<i", 0x0C: "<q"}


class _Reader:
    """A cursor over a byte buffer that decodes DWARF's variable-length numbers and pointers."""

    __slots__ = ("base", "buf", "pos")

    def __init__(self, buf: memoryview | bytes, pos: int, base: int) -> None:
        self.buf = buf
        self.pos = pos
        self.base = base  # the virtual address of buf[0], for pc-relative pointers

    def u8(self) -> int:
        v = self.buf[self.pos]
        self.pos += 1
        return v

    def unpack(self, fmt: str) -> int:
        v: int = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def uleb(self) -> int:
        return self._leb()[0]

    def sleb(self) -> int:
        value, bits = self._leb()
        return value - (1 << bits) if value >> (bits - 1) & 1 else value

    def _leb(self) -> tuple[int, int]:
        """A LEB128 number's bits and their count (the sign is the last bit, for the signed form)."""
        result = shift = 0
        while True:
            b = self.buf[self.pos]
            self.pos += 1
            result |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return result, shift

    def cstr(self) -> bytes:
        end = bytes(self.buf[self.pos : self.pos + 256]).index(b"\0")
        s = bytes(self.buf[self.pos : self.pos + end])
        self.pos += end + 1
        return s

    def pointer(self, encoding: int, *, relative: bool = True) -> int:
        """A pointer in one of DWARF's encodings (DW_EH_PE_*); ``relative=False`` reads only its format
        (an FDE's address range is a length, never relative)."""
        if encoding == 0xFF:
            return 0
        at = self.base + self.pos
        fmt = encoding & 0x0F
        if fmt == 0x01:
            v = self.uleb()
        elif fmt == 0x09:
            v = self.sleb()
        elif fmt in _POINTER_FORMATS:
            v = self.unpack(_POINTER_FORMATS[fmt])
        else:
            raise ElfError(f"pointer encoding {encoding:#x}")
        if relative and encoding & 0x70 == 0x10:  # pc-relative: the only application .eh_frame uses
            v += at
        elif relative and encoding & 0x70 not in (0x00, 0x10):
            raise ElfError(f"pointer application {encoding:#x}")
        return v & 0xFFFFFFFFFFFFFFFF


class ElfFile:
    """One mapped library or executable: opened once, read lazily, shared by every process mapping it."""

    def __init__(self, source: Path | bytes) -> None:
        """``source``: the file's path, or its image as bytes (the vDSO, which is in memory only)."""
        self._map: mmap.mmap | bytes
        if isinstance(source, bytes):
            size = len(source)
            self._map = source
        else:
            with source.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size >= 64:
                    self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if size < 64:
            raise ElfError("too short for an ELF header")
        self.data = memoryview(self._map)
        if bytes(self.data[:4]) != b"\x7fELF" or self.data[4] != 2 or self.data[5] != 1:
            raise ElfError("not a little-endian 64-bit ELF file")
        self.machine: int = struct.unpack_from("<H", self.data, 0x12)[0]
        phoff, shoff = struct.unpack_from("<QQ", self.data, 0x20)
        phentsize, phnum, shentsize, shnum, _ = struct.unpack_from("<HHHHH", self.data, 0x36)
        self.loads: list[tuple[int, int, int]] = []  # (p_offset, p_vaddr, p_filesz)
        self._executable: list[bool] = []  # each load segment's PF_X
        eh_hdr: tuple[int, int] | None = None
        for i in range(phnum):
            p_type, p_flags, p_offset, p_vaddr, _, p_filesz = struct.unpack_from(
                "<IIQQQQ", self.data, phoff + i * phentsize
            )
            if p_type == _PT_LOAD:
                self.loads.append((p_offset, p_vaddr, p_filesz))
                self._executable.append(bool(p_flags & _PF_X))
            elif p_type == _PT_GNU_EH_FRAME:
                eh_hdr = (p_offset, p_vaddr)
        self._sections: list[tuple[int, int, int, int]] = []  # (sh_type, sh_offset, sh_size, sh_link)
        if shoff and shentsize == 64 and shoff + shnum * 64 <= size:
            for i in range(shnum):
                _, sh_type, _, _, sh_offset, sh_size, sh_link = struct.unpack_from(
                    "<IIQQQQI", self.data, shoff + i * 64
                )
                self._sections.append((sh_type, sh_offset, sh_size, sh_link))
        self._table: memoryview | None = None
        self._hdr_vaddr = 0
        if eh_hdr is not None:
            self._read_search_table(*eh_hdr)
        self._cies: dict[int, _Cie] = {}
        self._rows: dict[int, Row | None] = {}
        self._names: dict[int, str | None] = {}

    # --- addresses ---------------------------------------------------------------------------------

    def bias_for(self, map_offset: int, map_start: int, executable: bool = True) -> int | None:
        """The load bias of a mapping of this file at ``map_start`` from file offset ``map_offset``: what
        is added to the file's virtual addresses to get the process's.

        The loader maps each segment from its page-rounded offset to its page-rounded address. Two
        segments can share a file page (lld packs a read-only segment and the code after it into one
        page, the code a page higher in memory than in the file): the one with the mapping's permission
        (``executable``) is the one mapped there."""
        fits = [
            (x, p_offset, p_vaddr)
            for x, (p_offset, p_vaddr, p_filesz) in zip(self._executable, self.loads, strict=True)
            if p_offset - (p_offset % PAGE) <= map_offset < p_offset + max(p_filesz, 1)
        ]
        if not fits:
            return None
        _, p_offset, p_vaddr = min(fits, key=lambda f: f[0] != executable)
        page_offset, page_vaddr = p_offset - p_offset % PAGE, p_vaddr - p_vaddr % PAGE
        return map_start - (page_vaddr + (map_offset - page_offset))

    def _offset_of(self, vaddr: int) -> int | None:
        for p_offset, p_vaddr, p_filesz in self.loads:
            if p_vaddr <= vaddr < p_vaddr + p_filesz:
                return vaddr - p_vaddr + p_offset
        return None

    def _read_search_table(self, offset: int, vaddr: int) -> None:
        version, ptr_enc, count_enc, table_enc = self.data[offset : offset + 4]
        if version != 1 or table_enc != 0x3B:  # datarel|sdata4: what every linker writes
            return
        r = _Reader(self.data, offset + 4, vaddr - offset)
        r.pointer(ptr_enc)
        count = r.pointer(count_enc)
        end = r.pos + count * 8
        if count == 0 or end > len(self.data) or r.pos % 4:
            return
        self._table = self.data[r.pos : end].cast("i")
        self._hdr_vaddr = vaddr

    @property
    def can_unwind(self) -> bool:
        return self.machine == EM_X86_64 and self._table is not None

    # --- call-frame information --------------------------------------------------------------------

    def row_at(self, pc: int) -> Row | None:
        """The CFI row in force at ``pc`` (a virtual address of this file), or None where no FDE covers it."""
        if pc in self._rows:
            return self._rows[pc]
        row = None
        try:
            row = self._find_row(pc)
        except (ElfError, IndexError, ValueError, struct.error):
            row = None
        if len(self._rows) < 200_000:
            self._rows[pc] = row
        return row

    def _find_row(self, pc: int) -> Row | None:
        table = self._table
        if table is None:
            return None
        starts = table[0::2]
        i = bisect.bisect_right(starts, pc - self._hdr_vaddr) - 1
        if i < 0:
            return None
        fde_offset = self._offset_of(self._hdr_vaddr + table[2 * i + 1])
        if fde_offset is None:
            return None
        return self._run_fde(fde_offset, pc)

    def _cie(self, offset: int) -> _Cie:
        cached = self._cies.get(offset)
        if cached is not None:
            return cached
        length = struct.unpack_from("<I", self.data, offset)[0]
        start = offset + 4
        if length == 0xFFFFFFFF:
            length = struct.unpack_from("<Q", self.data, start)[0]
            start += 8
        end = start + length
        r = _Reader(self.data, start + 4, self._vaddr_base(offset))
        version = r.u8()
        aug = r.cstr()
        if b"eh" in aug:
            r.unpack("<Q")
        code_align = r.uleb()
        data_align = r.sleb()
        ra_reg = r.u8() if version == 1 else r.uleb()
        fde_encoding = 0
        has_z = aug.startswith(b"z")
        signal = b"S" in aug
        if has_z:
            aug_len = r.uleb()
            aug_end = r.pos + aug_len
            for ch in aug[1:]:
                if ch == ord("R"):
                    fde_encoding = r.u8()
                elif ch == ord("P"):
                    r.pointer(r.u8())
                elif ch == ord("L"):
                    r.u8()
                elif ch in (ord("S"), ord("B")):
                    pass
                else:
                    break
            r.pos = aug_end
        cie = _Cie(code_align, data_align, ra_reg, fde_encoding, has_z, bytes(self.data[r.pos : end]), signal)
        self._cies[offset] = cie
        return cie

    def _vaddr_base(self, offset: int) -> int:
        """The virtual address of file offset 0 in the load segment holding ``offset`` (for pc-relative
        pointers inside .eh_frame)."""
        for p_offset, p_vaddr, p_filesz in self.loads:
            if p_offset <= offset < p_offset + p_filesz:
                return p_vaddr - p_offset
        return 0

    def _run_fde(self, offset: int, pc: int) -> Row | None:
        length = struct.unpack_from("<I", self.data, offset)[0]
        start = offset + 4
        if length == 0xFFFFFFFF:
            length = struct.unpack_from("<Q", self.data, start)[0]
            start += 8
        end = start + length
        cie_pointer = struct.unpack_from("<I", self.data, start)[0]
        if cie_pointer == 0:
            return None  # a CIE, not an FDE
        cie = self._cie(start - cie_pointer)
        r = _Reader(self.data, start + 4, self._vaddr_base(offset))
        pc_begin = r.pointer(cie.fde_encoding)
        pc_range = r.pointer(cie.fde_encoding & 0x0F, relative=False)
        if not pc_begin <= pc < pc_begin + pc_range:
            return None
        if cie.has_z:
            r.pos += r.uleb()
        state = _CfaState(cie)
        state.run(cie.initial, pc_begin, None)
        state.initial = dict(state.rules)
        state.run(bytes(self.data[r.pos : end]), pc_begin, pc)
        rules = dict(state.rules)
        if cie.ra_reg != RA and cie.ra_reg in rules:
            rules[RA] = rules[cie.ra_reg]
        rows = tuple(sorted(rules.items()))
        return Row(pc_begin, state.cfa_reg, state.cfa_offset, state.cfa_expr, rows, cie.signal)

    # --- names --------------------------------------------------------------------------------------

    def names_for(self, starts: set[int]) -> dict[int, str | None]:
        """The symbol names of these function starts (virtual addresses; None: no symbol there). The
        symbol tables are scanned once per batch of starts not seen before, never sorted or kept."""
        todo = {s for s in starts if s not in self._names}
        if todo:
            found: dict[int, str] = {}
            for table, strtab in self._symbol_tables():
                found.update(self._scan(table, strtab, todo - found.keys()))
                if len(found) == len(todo):
                    break
            for s in todo:
                self._names[s] = found.get(s)
        return {s: self._names[s] for s in starts}

    def _symbol_tables(self) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        out = []
        # .dynsym first: it is a seventh of torch's .symtab and names every exported function; .symtab
        # then only for the rest (local functions, an anonymous namespace's).
        for wanted in (_SHT_DYNSYM, _SHT_SYMTAB):
            for sh_type, sh_offset, sh_size, sh_link in self._sections:
                if sh_type == wanted and sh_link < len(self._sections):
                    _, str_offset, str_size, _ = self._sections[sh_link]
                    if sh_offset + sh_size <= len(self.data) and str_offset + str_size <= len(self.data):
                        out.append(((sh_offset, sh_size), (str_offset, str_size)))
        return out

    def _scan(self, table: tuple[int, int], strtab: tuple[int, int], wanted: set[int]) -> dict[int, str]:
        offset, size = table
        count = size // _SYM_SIZE
        if count == 0 or offset % 8:
            return {}
        # Whole columns at C speed: st_value is the second of each entry's three 8-byte words.
        values = self.data[offset : offset + count * _SYM_SIZE].cast("Q")[1::3].tolist()
        out: dict[int, str] = {}
        str_offset, str_size = strtab
        for i in [i for i, v in enumerate(values) if v in wanted]:
            name_off, info, _, shndx = struct.unpack_from("<IBBH", self.data, offset + i * _SYM_SIZE)
            if shndx == 0 or (info & 0x0F) not in (_STT_FUNC, _STT_GNU_IFUNC) or name_off >= str_size:
                continue
            at = str_offset + name_off
            end = self._map.find(b"\0", at, str_offset + str_size)
            if end > at:
                name = bytes(self.data[at:end]).decode("utf-8", "replace")
                known = out.get(values[i])
                if known is None or _preferred(name) < _preferred(known):
                    out[values[i]] = name
        return out


def _preferred(name: str) -> tuple[bool, int]:
    """Among aliases of one address, the name a person calls it: libc's ``select`` over ``__select``,
    ``pthread_cond_wait`` over ``__pthread_cond_wait`` (debug information names them so, and py-spy with
    it); C++'s mangled names all start ``_Z`` and are not penalised."""
    return (name.startswith("_") and not name.startswith("_Z"), len(name))


class _CfaState:
    """The CFA instructions' machine: the current row, the remembered ones, and the CIE's initial rules
    (what ``restore`` goes back to)."""

    __slots__ = ("cfa_expr", "cfa_offset", "cfa_reg", "cie", "initial", "rules", "stack")

    def __init__(self, cie: _Cie) -> None:
        self.cie = cie
        self.cfa_reg = RSP
        self.cfa_offset = 8
        self.cfa_expr = b""
        self.rules: dict[int, Rule] = {}
        self.initial: dict[int, Rule] = {}
        self.stack: list[tuple[int, int, bytes, dict[int, Rule]]] = []

    def run(self, code: bytes, loc: int, pc: int | None) -> None:
        """Run instructions from ``loc`` until the row that covers ``pc`` (None: all of them, a CIE's)."""
        r = _Reader(code, 0, 0)
        align = self.cie.code_align
        while r.pos < len(code):
            op = r.u8()
            if op & 0xC0 == 0x40:  # advance_loc
                loc += (op & 0x3F) * align
            elif op == 0x01:  # set_loc: never in .eh_frame (GCC, LLVM); its pointer's base is unknown here
                raise ElfError("DW_CFA_set_loc in .eh_frame")
            elif op in (0x02, 0x03, 0x04):  # advance_loc1/2/4
                loc += (r.u8() if op == 0x02 else r.unpack("<H" if op == 0x03 else "<I")) * align
            else:
                self._rule(op, r, code)
                continue
            if pc is not None and loc > pc:
                return

    def _rule(self, op: int, r: _Reader, code: bytes) -> None:
        da = self.cie.data_align
        rules = self.rules
        if op & 0xC0 == 0x80:  # offset
            rules[op & 0x3F] = Rule("offset", r.uleb() * da)
        elif op & 0xC0 == 0xC0:  # restore
            self._restore(op & 0x3F)
        elif op in (0x05, 0x11, 0x2F):  # offset_extended, its signed form, GNU's negative one
            reg = r.uleb()
            n = r.uleb() if op == 0x05 else r.sleb() if op == 0x11 else -r.uleb()
            rules[reg] = Rule("offset", n * da)
        elif op == 0x06:
            self._restore(r.uleb())
        elif op == 0x07:
            rules[r.uleb()] = Rule("undefined")
        elif op == 0x08:
            rules.pop(r.uleb(), None)  # same value
        elif op == 0x09:
            reg = r.uleb()
            rules[reg] = Rule("register", r.uleb())
        elif op == 0x0A:
            self.stack.append((self.cfa_reg, self.cfa_offset, self.cfa_expr, dict(rules)))
        elif op == 0x0B:
            if self.stack:
                self.cfa_reg, self.cfa_offset, self.cfa_expr, self.rules = self.stack.pop()
        elif op in (0x0C, 0x12):  # def_cfa, def_cfa_sf
            self.cfa_reg, self.cfa_expr = r.uleb(), b""
            self.cfa_offset = r.uleb() if op == 0x0C else r.sleb() * da
        elif op == 0x0D:
            self.cfa_reg, self.cfa_expr = r.uleb(), b""
        elif op in (0x0E, 0x13):  # def_cfa_offset, def_cfa_offset_sf
            self.cfa_offset = r.uleb() if op == 0x0E else r.sleb() * da
        elif op == 0x0F:
            n = r.uleb()
            self.cfa_expr = bytes(code[r.pos : r.pos + n])
            r.pos += n
        elif op in (0x10, 0x16):
            reg, n = r.uleb(), r.uleb()
            kind = "expression" if op == 0x10 else "val_expression"
            rules[reg] = Rule(kind, expr=bytes(code[r.pos : r.pos + n]))
            r.pos += n
        elif op in (0x14, 0x15):
            reg = r.uleb()
            rules[reg] = Rule("val_offset", (r.uleb() if op == 0x14 else r.sleb()) * da)
        elif op == 0x2E:  # GNU_args_size
            r.uleb()
        elif op != 0x00:  # nop
            raise ElfError(f"CFA instruction {op:#x}")

    def _restore(self, reg: int) -> None:
        if reg in self.initial:
            self.rules[reg] = self.initial[reg]
        else:
            self.rules.pop(reg, None)


# DW_OP_const1u .. const8s, and the two-operand operations (the comparisons give 1 or 0).
_CONST_FORMATS = dict(zip(range(0x08, 0x10), ("<B", "<b", "<H", "<h", "<I", "<i", "<Q", "<q"), strict=True))
_BINARY: dict[int, Callable[[int, int], int | bool]] = {
    0x1A: operator.and_,
    0x1C: operator.sub,
    0x1E: operator.mul,
    0x21: operator.or_,
    0x22: operator.add,
    0x24: operator.lshift,
    0x25: operator.rshift,
    0x27: operator.xor,
    0x29: operator.eq,
    0x2A: operator.ge,
    0x2B: operator.gt,
    0x2C: operator.le,
    0x2D: operator.lt,
    0x2E: operator.ne,
}


_COMPARISONS = frozenset(range(0x29, 0x2F))


def _signed(value: int) -> int:
    return value - (1 << 64) if value & (1 << 63) else value


def evaluate(
    expr: bytes, regs: dict[int, int], read: Callable[[int], int], push_cfa: int | None = None
) -> int:
    """A DWARF expression's value: the subset compilers emit in CFI (PLT stubs, signal frames, realigned
    stacks). ``read`` is a callable address -> 8-byte value; unknown operations raise ``ElfError``."""
    reader = _Reader(expr, 0, 0)
    stack: list[int] = [] if push_cfa is None else [push_cfa]
    mask = 0xFFFFFFFFFFFFFFFF
    while reader.pos < len(expr):
        op = reader.u8()
        if 0x30 <= op <= 0x4F:
            stack.append(op - 0x30)
        elif 0x70 <= op <= 0x8F:
            reg = op - 0x70
            if reg not in regs:
                raise ElfError(f"register {reg} unknown")
            stack.append((regs[reg] + reader.sleb()) & mask)
        elif op == 0x06:
            stack.append(read(stack.pop()))
        elif op in (0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F):
            stack.append(reader.unpack(_CONST_FORMATS[op]) & mask)
        elif op == 0x10:
            stack.append(reader.uleb())
        elif op == 0x11:
            stack.append(reader.sleb() & mask)
        elif op == 0x12:
            stack.append(stack[-1])
        elif op == 0x13:
            stack.pop()
        elif op == 0x14:
            stack.append(stack[-2])
        elif op == 0x16:
            stack[-1], stack[-2] = stack[-2], stack[-1]
        elif op == 0x23:
            stack.append((stack.pop() + reader.uleb()) & mask)
        elif op in _BINARY:
            b, a = stack.pop(), stack.pop()
            if op in _COMPARISONS:  # DWARF compares as signed values
                a, b = _signed(a), _signed(b)
            stack.append(int(_BINARY[op](a, b)) & mask)
        else:
            raise ElfError(f"DWARF operation {op:#x}")
    if not stack:
        raise ElfError("empty DWARF expression")
    return stack[-1]
