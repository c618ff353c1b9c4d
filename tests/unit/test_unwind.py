"""The native unwinder's parts without a target: ELF reading on this machine's own libc, DWARF expressions,
the grabber's answer, py-spy's merge rule, names, and the fallback to py-spy's own ``--native``.
(Real processes: tests/integration/test_native_unwind.py.)"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest

from hangwatch.collect import procfs
from hangwatch.collect.elf import RA
from hangwatch.collect.elf import RSP
from hangwatch.collect.elf import ElfError
from hangwatch.collect.elf import ElfFile
from hangwatch.collect.elf import evaluate
from hangwatch.collect.stacks import DumpRun
from hangwatch.collect.stacks import StackDumper
from hangwatch.collect.unwind import _CLONE
from hangwatch.collect.unwind import NativeFrame
from hangwatch.collect.unwind import NativeStacks
from hangwatch.collect.unwind import NativeUnwinder
from hangwatch.collect.unwind import UnwindError
from hangwatch.collect.unwind import _own_vdso
from hangwatch.collect.unwind import _parse_grabs
from hangwatch.collect.unwind import cython_name
from hangwatch.collect.unwind import merge
from hangwatch.model.samples import ProcessId
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import ProcessStacks


def _libc_function(name: str) -> tuple[ElfFile, int]:
    """A libc function of this very process: its file, and its address as the file numbers it."""
    address = ctypes.cast(getattr(ctypes.CDLL(ctypes.util.find_library("c")), name), ctypes.c_void_p).value
    assert address is not None
    maps = procfs.read_maps(os.getpid())
    assert maps is not None
    start, _, _, offset, _, path = next(m for m in maps if m[0] <= address < m[1])
    elf = ElfFile(Path(path))
    bias = elf.bias_for(offset, start)
    assert bias is not None
    return elf, address - bias


@pytest.mark.skipif(NativeUnwinder().unavailable is not None, reason="x86_64 with c++filt only")
def test_libcs_own_tables_give_a_functions_start_its_row_and_its_name():
    elf, getpid = _libc_function("getpid")
    assert elf.can_unwind
    row = elf.row_at(getpid)
    assert row is not None and row.start == getpid
    # At a function's first instruction the caller's return address is at the stack pointer.
    assert row.cfa_reg == RSP and row.cfa_offset == 8 and dict(row.rules)[RA].kind == "offset"
    assert elf.names_for({getpid}) == {getpid: "getpid"}
    # Aliases of one address: the name a person calls it, not the internal one.
    _, select = _libc_function("select")
    assert elf.names_for({select})[select] == "select"
    assert elf.names_for({getpid + 1}) == {getpid + 1: None}  # no function starts there


def test_a_file_that_is_not_elf64_is_refused(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not a library at all, but long enough to have a header's worth of bytes in it\n")
    with pytest.raises(ElfError, match="not a little-endian 64-bit ELF"):
        ElfFile(text)
    with pytest.raises(ElfError, match="too short"):
        (tmp_path / "tiny").write_bytes(b"\x7fELF")
        ElfFile(tmp_path / "tiny")


def test_a_plt_stubs_cfa_expression_is_evaluated():
    # DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15; DW_OP_and; DW_OP_lit11; DW_OP_ge; DW_OP_lit3; DW_OP_shl;
    # DW_OP_plus: the CFA of a PLT entry is rsp+8, plus 8 once past its push (rip & 15 >= 11).
    plt = bytes([0x77, 8, 0x80, 0, 0x3F, 0x1A, 0x3B, 0x2A, 0x33, 0x24, 0x22])
    assert evaluate(plt, {RSP: 0x1000, RA: 0x4010}, lambda a: 0) == 0x1008
    assert evaluate(plt, {RSP: 0x1000, RA: 0x401B}, lambda a: 0) == 0x1010
    # DW_OP_breg7 0; DW_OP_deref: a value read from memory.
    assert evaluate(bytes([0x77, 0, 0x06]), {RSP: 0x2000}, {0x2000: 77}.__getitem__) == 77
    with pytest.raises(ElfError, match="DWARF operation"):
        evaluate(bytes([0x96]), {}, lambda a: 0)


def test_cfa_rows_follow_advances_remembered_and_restored_state():
    """A function's CFI as GCC writes it (push rbp; ...; an early return between remember and restore):
    the row at each pc is the one in force there."""
    from hangwatch.collect.elf import _CfaState
    from hangwatch.collect.elf import _Cie

    # CIE: CFA = rsp + 8, return address at CFA - 8 (code align 1, data align -8).
    cie = _Cie(1, -8, RA, 0x1B, True, bytes([0x0C, RSP, 8, 0x80 | RA, 1]), False)
    fde = bytes(
        [
            0x41, 0x0E, 16, 0x86, 2,  # at +1: CFA = rsp + 16, rbp at CFA - 16
            0x43, 0x0A, 0x0E, 8,  # at +4: remember; CFA = rsp + 8 (an early return's epilogue)
            0x41, 0x0B,  # at +5: restore (CFA = rsp + 16 again)
            0x42, 0xC6,  # at +7: restore rbp to the CIE's rule (none)
        ]
    )  # fmt: skip

    def row(pc: int) -> tuple[int, dict]:
        state = _CfaState(cie)
        state.run(cie.initial, 0x1000, None)
        state.initial = dict(state.rules)
        state.run(fde, 0x1000, pc)
        return state.cfa_offset, {reg: rule.value for reg, rule in state.rules.items()}

    assert row(0x1000) == (8, {RA: -8})
    assert row(0x1001) == row(0x1003) == (16, {RA: -8, 6: -16})
    assert row(0x1004) == (8, {RA: -8, 6: -16})
    assert row(0x1005) == row(0x1006) == (16, {RA: -8, 6: -16})
    assert row(0x1007) == (16, {RA: -8})


def test_leb128_numbers_read_as_dwarf_writes_them():
    from hangwatch.collect.elf import _Reader

    cases = [(b"\x02", 2, 2), (b"\x7f", 127, -1), (b"\x80\x01", 128, 128), (b"\x80\x7f", 16256, -128)]
    cases += [(b"\xe5\x8e\x26", 624485, 624485), (b"\xc0\xbb\x78", 1973696, -123456)]
    for data, unsigned, signed in cases:
        assert (_Reader(data, 0, 0).uleb(), _Reader(data, 0, 0).sleb()) == (unsigned, signed), data


def test_the_grabbers_answer_is_read_thread_by_thread():
    regs = tuple(range(27))
    ok = struct.pack("<iiQI", 11, 0, 0x7000, 4) + struct.pack("<27Q", *regs) + b"abcd"
    gone = struct.pack("<iiQI", 12, 1, 0, 0)
    late = struct.pack("<iiQI", 13, 3, 0, 0)
    grabs, missing = _parse_grabs(ok + gone + late)
    [g] = grabs
    assert (g.tid, g.regs, g.start, g.stack) == (11, regs, 0x7000, b"abcd")
    assert missing == {12: "the thread ended", 13: "did not stop in time"}
    cut = struct.pack("<iiQI", 14, 0, 0x7000, 4096) + struct.pack("<27Q", *regs) + b"ab"
    assert _parse_grabs(cut) == ([], {14: "the grabber's answer was cut short"})


@dataclass(frozen=True)
class _Py:
    name: str
    is_entry: bool = False
    is_shim_entry: bool = False


def _native(name: str | None, interpreter: bool = False, module: str = "/usr/lib/libx.so") -> NativeFrame:
    return NativeFrame(0x1000, module, name, interpreter)


def _names(frames: list | None) -> list[str] | None:
    return None if frames is None else [f.name for f in frames]


def test_each_eval_loop_call_is_replaced_by_the_python_frames_it_runs():
    python = [_Py("leaf", is_entry=True), _Py("middle"), _Py("outer", is_entry=True)]
    native = [
        _native("pthread_cond_wait", module="/lib/libc.so.6"),
        _native("c10d::Work::wait"),
        _native("cfunction_vectorcall_FASTCALL", True),  # the interpreter's glue: dropped
        _native("_PyEval_EvalFrameDefault", True),
        _native("_PyEval_Vector", True),
        _native("_PyEval_EvalFrameDefault.cold", True),  # a compiler's clone of the eval loop
        _native("Py_BytesMain", True),
        _native("__libc_start_main", module="/lib/libc.so.6"),  # the process's start: dropped
        _native("_start", True),
    ]
    merged = merge(python, native, lambda f: _Py(f.name or "??"))
    assert _names(merged) == ["pthread_cond_wait", "c10d::Work::wait", "leaf", "middle", "outer"]


def test_the_interpreters_own_waits_are_kept():
    python = [_Py("worker", is_entry=True)]
    native = [
        _native("futex_wait", module="/lib/libc.so.6"),
        _native("lock_PyThread_acquire_lock", True),
        _native("time_sleep", True),
        _native("_PyEval_EvalFrameDefault", True),
    ]
    merged = merge(python, native, lambda f: _Py(f.name or "??"))
    assert _names(merged) == ["futex_wait", "lock_PyThread_acquire_lock", "time_sleep", "worker"]


def test_stacks_that_disagree_are_not_merged_and_a_short_unwinding_keeps_the_python_frames():
    python = [_Py("a", is_entry=True), _Py("b", is_entry=True), _Py("c", is_entry=True)]
    eval_frame = _native("_PyEval_EvalFrameDefault", True)
    make = lambda f: _Py(f.name or "??")  # noqa: E731
    assert merge(python, [eval_frame], make) is None  # one eval call for three entry frames: it moved
    assert _names(merge(python, [eval_frame] * 4, make)) == ["a", "b", "c"]  # one more: py-spy lets it go
    # The unwinding stopped before any eval loop (a library without unwind tables): Python frames below.
    assert _names(merge(python, [_native("memcpy")], make)) == ["memcpy", "a", "b", "c"]


def test_a_functions_clones_carry_its_name():
    for clone, name in [
        ("select_select_impl.constprop.0", "select_select_impl"),
        ("encoder_listencode_obj.isra.0", "encoder_listencode_obj"),
        ("f.part.3.cold", "f"),
        ("c10d::Foo::bar() [clone .cold]", "c10d::Foo::bar()"),
    ]:
        assert _CLONE.sub("", clone) == name
    assert _CLONE.sub("", "decimal.Context") == "decimal.Context"


def test_cython_names_and_helpers_are_read_as_py_spy_reads_them():
    # py-spy's own cases (cython.rs), and CuPy's wrapper as the GPU check met it.
    for mangled, name in [
        ("__pyx_pw_13cupy_backends_4cuda_3api_7runtime_27deviceSynchronize", "deviceSynchronize"),
        ("__pyx_pf_8implicit_4_als_30_least_squares_cg", "_least_squares_cg"),
        ("__pyx_pw_8implicit_4_als_5least_squares_cg", "least_squares_cg"),
        ("__pyx_fuse_1_0__pyx_pw_8implicit_4_als_31_least_squares_cg", "_least_squares_cg"),
        ("__pyx_f_6mtrand_cont0_array", "mtrand_cont0_array"),
        ("__pyx_fuse_0__pyx_f_8implicit_4_als_axpy", "_als_axpy"),
        ("__pyx_fuse_1__pyx_f_8implicit_3bpr_has_non_zero", "bpr_has_non_zero"),
        ("__pyx_pw_", "_"),  # nothing past the prefix: as py-spy leaves it
        ("__pyx_pw_99x", "x"),  # a length past the end: what is left
        ("memcpy", "memcpy"),
        ("__pyx_unknown_helper", "__pyx_unknown_helper"),
    ]:
        assert cython_name(mangled) == name, mangled
    python = [_Py("host_wait", is_entry=True)]
    native = [
        _native("cudaDeviceSynchronize"),
        _native("deviceSynchronize"),
        _native("__Pyx_PyObject_Call"),  # Cython's call helper: dropped
        _native("_PyEval_EvalFrameDefault", True),
    ]
    merged = merge(python, native, lambda f: _Py(f.name or "??"))
    assert _names(merged) == ["cudaDeviceSynchronize", "deviceSynchronize", "host_wait"]


def test_another_architecture_or_no_demangler_is_said():
    assert "x86_64 only" in str(NativeUnwinder(machine="aarch64", cxxfilt="/usr/bin/c++filt").unavailable)
    assert "c++filt" in str(NativeUnwinder(machine="x86_64", cxxfilt="").unavailable)
    assert NativeUnwinder(machine="x86_64", cxxfilt="/usr/bin/c++filt").unavailable is None


class _FakeGrab:
    def run(self, tids):
        raise AssertionError("a fake unwinder's grab is never run")

    def cancel(self) -> None:
        pass


class _Unwinder(NativeUnwinder):
    """Our unwinder with its grab and unwinding replaced: ``stacks`` answers each call in turn, an
    exception is raised."""

    def __init__(self, *answers):
        super().__init__(machine="x86_64", cxxfilt="c++filt")
        self.answers = list(answers)
        self.calls = 0

    def start(self, pid):
        return _FakeGrab()

    def unwind(self, pid, tids, grab=None):
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


# py-spy's JSON for a process of two threads: its main thread (tid 1) and tid 2, one frame each.
_PY_SPY = json.dumps(
    [
        {"thread_id": 1, "os_thread_id": tid, "active": False, "frames": [
            {"name": name, "filename": "/x.py", "line": 3, "is_entry": True}
        ]}
        for tid, name in ((1, "main"), (2, "worker"))
    ]
)  # fmt: skip
_EVAL = NativeFrame(0x10, "/usr/lib/libpython3.11.so", "_PyEval_EvalFrameDefault", True)
_WAIT = NativeFrame(0x20, "/usr/lib/libc.so.6", "pthread_cond_wait", False)


def _stacks(*tids: int, frames=(_WAIT, _EVAL)) -> NativeStacks:
    return NativeStacks({tid: tuple(frames) for tid in tids}, {}, 0.01)


def _dumper(unwinder: NativeUnwinder, calls: list[list[str]], py_spy: str = _PY_SPY) -> StackDumper:
    def runner(argv: list[str], deadline: float) -> DumpRun:
        calls.append(argv)
        return DumpRun(0, py_spy, "", 0.01)

    return StackDumper("py-spy", runner=runner, unwinder=unwinder)


_BASE = ProcessStacks(1, "p", None, None, DumpOutcome.OK)
_ID = ProcessId(1, 100)


def test_our_dump_counts_the_main_threads_stops_py_spys_and_the_copy():
    calls: list[list[str]] = []
    result = _dumper(_Unwinder(_stacks(1, 2)), calls)._dump_once(_BASE, True, _ID)
    assert result.native and result.stops == 2
    assert [[f.name for f in t.frames] for t in result.threads] == [["main", "pthread_cond_wait"]] * 1 + [
        ["worker", "pthread_cond_wait"]
    ]
    # The copy did not hold the main thread (py-spy listed no Python thread for it): py-spy's stop only.
    # Counting a stop that did not happen would hide a real poll's wakeups.
    workers_only = json.dumps([t for t in json.loads(_PY_SPY) if t["os_thread_id"] == 2])
    alone = _dumper(_Unwinder(_stacks(2)), [], workers_only)._dump_once(_BASE, True, _ID)
    assert alone.native and alone.stops == 1


def test_a_thread_the_copy_missed_leaves_the_dump_to_py_spys_native():
    # The main thread was listed by py-spy but not copied (it ended, or did not stop in time): no dump of
    # ours marks a thread native without its native frames.
    calls: list[list[str]] = []
    result = _dumper(_Unwinder(_stacks(2), _stacks(2)), calls)._dump_once(_BASE, True, _ID)
    assert [a[-1] for a in calls] == ["--json", "--json", "--native"] and result.stops == 1 + 1 + 1


def test_a_thread_that_moves_twice_running_is_left_to_py_spys_native_with_every_stop_counted():
    calls: list[list[str]] = []
    moved = _stacks(1, 2, frames=(_WAIT,) + (_EVAL,) * 3)  # three eval calls for one Python frame
    unwinder = _Unwinder(moved, moved)
    result = _dumper(unwinder, calls)._dump_once(_BASE, True, _ID)
    assert [a[-1] for a in calls] == ["--json", "--json", "--native"] and unwinder.calls == 2
    assert result.stops == 2 + 2 + 1


def test_a_process_our_unwinder_cannot_read_is_dumped_by_py_spy_native_from_then_on():
    calls: list[list[str]] = []
    dumper = _dumper(_Unwinder(UnwindError("not permitted"), ValueError("never asked")), calls)
    first = dumper._dump_once(_BASE, True, _ID)
    assert first.outcome is DumpOutcome.OK and first.native and first.stops == 1 + 1
    assert [a[-1] for a in calls] == ["--json", "--native"]  # ours first, then py-spy's own
    calls.clear()
    again = dumper._dump_once(_BASE, True, _ID)
    assert [a[-1] for a in calls] == ["--native"] and again.stops == 1
    # An unwinder that raises what it never should is py-spy's turn too, never the watch's end.
    calls.clear()
    odd = _dumper(_Unwinder(KeyError("a race")), calls)._dump_once(_BASE, True, _ID)
    assert odd.outcome is DumpOutcome.OK and [a[-1] for a in calls] == ["--json", "--native"]


def test_a_py_spy_that_cannot_stop_the_process_is_a_timeout_without_a_native_wait():
    calls: list[list[str]] = []

    def runner(argv: list[str], deadline: float) -> DumpRun:
        calls.append(argv)
        return DumpRun(None, "", "", deadline)

    dumper = StackDumper("py-spy", runner=runner, unwinder=_Unwinder())
    result = dumper._dump_once(_BASE, True, _ID)
    assert result.outcome is DumpOutcome.TIMEOUT and result.stops == 0
    assert [a[-1] for a in calls] == ["--json"]  # not a --native run as long again


def test_an_lld_packed_library_is_biased_by_its_code_segment():
    """lld puts a read-only segment and the code after it in one file page, the code a page higher in
    memory (orjson's wheel: R at 0x0/0x0, R E at 0xde90/0xee90): the code's mapping from offset 0xd000
    is biased by the executable segment, not the first one that covers the page."""
    import tempfile

    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<HH", header, 0x10, 3, 62)
    struct.pack_into("<QQ", header, 0x20, 64, 0)  # program headers at 64, no sections
    struct.pack_into("<HHHHH", header, 0x36, 56, 2, 64, 0, 0)
    loads = struct.pack("<IIQQQQQQ", 1, 4, 0x0, 0x0, 0x0, 0xDE90, 0xDE90, 0x1000)
    loads += struct.pack("<IIQQQQQQ", 1, 5, 0xDE90, 0xEE90, 0xEE90, 0x2B930, 0x2B930, 0x1000)
    with tempfile.NamedTemporaryFile(suffix=".so") as f:
        f.write(bytes(header) + loads)
        f.flush()
        elf = ElfFile(Path(f.name))
        start = 0x7F0000000000
        assert elf.bias_for(0xD000, start + 0xE000, executable=True) == start
        assert elf.bias_for(0x0, start, executable=False) == start
        assert not elf.can_unwind  # no .eh_frame_hdr: frames there are named only


def test_the_maps_name_files_and_the_vdso_only():
    text = (
        "7f0000000000-7f0000001000 r-xp 00001000 08:01 1234 /usr/lib/libc.so.6\n"
        "7f0000002000-7f0000003000 rw-p 00000000 00:00 0 \n"
        "7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0 [vdso]\n"
        "7ffd00004000-7ffd00006000 r--p 00000000 00:00 0 [vvar]\n"
        "55aa00000000-55aa00021000 rw-p 00000000 00:00 0 [heap]\n"
        "7f0000004000-7f0000005000 r-xp 00000000 08:01 99 /tmp/a library (deleted)\n"
    )
    assert procfs.parse_maps(text) == [
        (0x7F0000000000, 0x7F0000001000, "r-xp", 0x1000, 1234, "/usr/lib/libc.so.6"),
        (0x7F0000004000, 0x7F0000005000, "r-xp", 0, 99, "/tmp/a library (deleted)"),
        (0x7FFD00000000, 0x7FFD00002000, "r-xp", 0, 0, "[vdso]"),
    ]
    # The kernel's image, read from our own mapping: the same for every 64-bit process of this kernel.
    image = _own_vdso()
    if image:
        elf = ElfFile(image)
        assert elf.can_unwind
        named = elf.names_for(set(range(len(image))))  # every address: the functions' starts answer
        assert "clock_gettime" in named.values()
        start = next(f for f, n in named.items() if n == "clock_gettime")
        assert elf.row_at(start) is not None  # its unwind row: a thread in it unwinds to its caller
