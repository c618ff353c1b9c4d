"""The fat-binary reader on real nvcc output, on damaged files, and against cuobjdump."""

from __future__ import annotations

import struct

import pytest

from cuda_artefacts import EXPECTED
from hangwatch.collect import cuobjdump
from hangwatch.collect.fatbin import read_fatbins
from hangwatch.collect.fatbin import read_fatbins_from_bytes
from hangwatch.model.doctor import EntryKind


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_targets_of_real_modules(artefacts, name):
    scan = read_fatbins(artefacts / f"{name}.so")
    sass, ptx = EXPECTED[name]
    assert scan.unreadable is None
    assert scan.problems == ()
    assert set(scan.targets(EntryKind.SASS)) == set(sass)
    assert set(scan.targets(EntryKind.PTX)) == set(ptx)


def test_entry_details(artefacts):
    ptx = [
        e
        for c in read_fatbins(artefacts / "sm90_ptx.so").containers
        for e in c.entries
        if e.kind is EntryKind.PTX
    ]
    assert ptx and ptx[0].arch == 90 and ptx[0].ptx_version is not None
    major, minor = ptx[0].ptx_version.split(".")
    assert int(major) >= 7 and minor.isdigit()
    compressed = [e for c in read_fatbins(artefacts / "sm90_compressed.so").containers for e in c.entries]
    assert compressed and all(e.compression in ("zstd", "lz4") for e in compressed)
    arch_specific = [e for c in read_fatbins(artefacts / "sm100a.so").containers for e in c.entries]
    assert {(e.arch, e.variant) for e in arch_specific} == {(100, "a")}


def test_relocatable_copy_is_not_what_loads(artefacts):
    scan = read_fatbins(artefacts / "sm90_rdc.so")
    sections = {c.section for c in scan.containers}
    assert sections == {".nv_fatbin", "__nv_relfatbin"}
    assert all(not c.relocatable for c in scan.loadable)


def test_library_without_section_headers_is_searched_by_segment(artefacts, tmp_path):
    data = bytearray((artefacts / "multi.so").read_bytes())
    struct.pack_into("<Q", data, 0x28, 0)  # e_shoff = 0: what sstrip leaves
    struct.pack_into("<HHH", data, 0x3C, 0, 0, 0)
    scan = read_fatbins_from_bytes(bytes(data), "stripped")
    assert scan.unreadable is None
    assert {c.section for c in scan.containers} == {"segment"}
    assert set(scan.targets(EntryKind.SASS)) == {"sm_90", "sm_100a", "sm_120"}


def test_host_only_library_has_no_device_code():
    scan = read_fatbins("/bin/ls")
    assert scan.unreadable is None
    assert not scan.has_device_code


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "not an ELF"),
        (b"hello world, this is text" * 4, "not an ELF"),
        (b"\x7fELF\x01\x01\x01" + b"\0" * 60, "32-bit"),
        (b"\x7fELF\x02\x02\x01" + b"\0" * 60, "big-endian"),
        (b"\x7fELF\x02\x01\x01" + b"\0" * 33 + b"\xff" * 8 + b"\0" * 20, "outside the file"),
    ],
)
def test_junk_is_a_reason_not_a_crash(tmp_path, content, reason):
    path = tmp_path / "junk.so"
    path.write_bytes(content)
    scan = read_fatbins(path)
    assert scan.unreadable is not None and reason in scan.unreadable


def test_truncated_and_damaged_modules(artefacts, tmp_path):
    data = (artefacts / "sm90_ptx.so").read_bytes()
    cut = tmp_path / "cut.so"
    cut.write_bytes(data[: len(data) // 2])
    scan = read_fatbins(cut)
    assert scan.unreadable is not None or scan.problems  # section headers live at the end: usually unreadable
    # Damage the first container's size field: reported as a problem, the rest still read.
    start = data.index(struct.pack("<I", 0xBA55ED50))
    bad = bytearray(data)
    struct.pack_into("<Q", bad, start + 8, 1 << 40)
    scan = read_fatbins_from_bytes(bytes(bad), "bad")
    assert scan.unreadable is None
    assert any("does not fit" in p for p in scan.problems)
    # Random bytes inside the section never raise.
    noisy = bytearray(data)
    for i in range(start + 16, min(start + 2000, len(noisy)), 7):
        noisy[i] = (noisy[i] * 31 + 17) % 256
    read_fatbins_from_bytes(bytes(noisy), "noisy")


def test_missing_file():
    scan = read_fatbins("/no/such/file.so")
    assert scan.unreadable is not None and "cannot read" in scan.unreadable


def test_cuobjdump_agrees(artefacts):
    tool = cuobjdump.find_cuobjdump()
    if tool is None:
        pytest.skip(
            "cuobjdump not found (PATH, $CUDA_HOME/bin, $HANGWATCH_CUOBJDUMP): "
            "pip install nvidia-cuda-cuobjdump"
        )
    for name in sorted(EXPECTED):
        scan = read_fatbins(artefacts / f"{name}.so")
        listing = cuobjdump.list_targets(str(artefacts / f"{name}.so"), tool)
        assert listing.error is None, (name, listing.error)
        assert cuobjdump.normalise_for_cuobjdump(scan.targets(EntryKind.SASS)) == listing.sass, name
        assert frozenset(scan.targets(EntryKind.PTX)) == listing.ptx, name


def test_cuobjdump_listing_parser():
    text = "ELF file    1: x.1.sm_90a.cubin\nELF file    2: x.2.sm_120.cubin\nPTX file    1: x.1.sm_90.ptx\n"
    listing = cuobjdump.parse_listing(text)
    assert listing.sass == {"sm_90a", "sm_120"}
    assert listing.ptx == {"compute_90"}


def test_cuobjdump_override_that_does_not_exist(monkeypatch):
    monkeypatch.setenv("HANGWATCH_CUOBJDUMP", "/no/such/cuobjdump")
    assert cuobjdump.find_cuobjdump() is None


def test_section_names_from_headers_only(tmp_path):
    from elfcraft import cuda_module
    from elfcraft import host_module
    from elfcraft import shared_object
    from hangwatch.collect.fatbin import carries_device_code
    from hangwatch.collect.fatbin import section_names

    cuda, host, stripped, junk = (tmp_path / n for n in ("cuda.so", "host.so", "stripped.so", "junk.so"))
    cuda.write_bytes(cuda_module([90]))
    host.write_bytes(host_module())
    stripped.write_bytes(shared_object({".nv_fatbin": b""}, strip_section_headers=True))
    junk.write_bytes(b"not an elf at all" * 8)
    assert section_names(cuda) == {".text", ".nv_fatbin", ".shstrtab"}
    assert carries_device_code(cuda) is True
    assert section_names(host) == {".text", ".data", ".shstrtab"}
    assert carries_device_code(host) is False
    assert (
        section_names(stripped) is None and carries_device_code(stripped) is True
    )  # only a full scan can tell
    assert section_names(junk) == set() and carries_device_code(junk) is False
    assert carries_device_code("/bin/ls") is False
    assert carries_device_code(tmp_path / "missing.so") is False
