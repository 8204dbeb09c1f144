"""Pure tests of the eBPF encoder and classifier generator (no root, no kernel)."""

import random
import re
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shaperd.kernel import bpf


# Reference encodings per the kernel's Documentation/bpf/standardization/
# instruction-set.rst (opcode, dst|src<<4, s16 off, s32 imm; little-endian),
# cross-checked with `llvm-mc -triple bpfel -show-encoding`.
@pytest.mark.parametrize(
    "insn, expected",
    [
        (bpf.ldx_w(2, 1, 36), "61 12 24 00 00 00 00 00"),  # r2 = *(u32 *)(r1 + 36)
        (bpf.mov32_imm(0, 0), "b4 00 00 00 00 00 00 00"),  # w0 = 0
        (bpf.mov32_imm(0, 0x73680010), "b4 00 00 00 10 00 68 73"),
        # u32 class id with the top bit set keeps its bit pattern
        (bpf.mov32_imm(0, 0xFFFE0001), "b4 00 00 00 01 00 fe ff"),
        (bpf.jne_imm(2, 7, 2), "55 02 02 00 07 00 00 00"),  # if r2 != 7 goto +2
        (bpf.jne_imm(2, 1, -3), "55 02 fd ff 01 00 00 00"),
        (bpf.exit_(), "95 00 00 00 00 00 00 00"),
    ],
)
def test_instruction_encoding(insn, expected):
    assert insn.hex(" ") == expected


def test_encoder_rejects_out_of_range_fields():
    with pytest.raises(ValueError):
        bpf.jne_imm(2, 1, 2**15)
    with pytest.raises(ValueError):
        bpf.mov32_imm(0, 2**32)
    with pytest.raises(ValueError):
        bpf.ldx_w(11, 1, 0)


def decode(prog):
    return [struct.unpack("<BBhI", prog[i : i + 8]) for i in range(0, len(prog), 8)]


def interpret(prog, ingress_ifindex):
    """Tiny interpreter for exactly the ops we emit; returns r0 as u32."""
    regs, pc, insns = [0] * 11, 0, decode(prog)
    while True:
        code, regbyte, off, imm = insns[pc]
        dst, src = regbyte & 0xF, regbyte >> 4
        if code == 0x61:
            assert (src, off) == (1, 36)  # only ever skb->ingress_ifindex
            regs[dst] = ingress_ifindex
        elif code == 0xB4:
            regs[dst] = imm  # 32-bit mov: zero-extended
        elif code == 0x55:
            simm = imm - 2**32 if imm & 0x80000000 else imm
            if regs[dst] != simm & 0xFFFFFFFFFFFFFFFF:
                pc += off
        elif code == 0x95:
            return regs[0] & 0xFFFFFFFF
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")
        pc += 1


def test_classifier_layout():
    prog = bpf.ifindex_classifier({7: 0x73680010, 3: 0x73680011})
    assert prog.hex(" ", 8).split() == [
        "6112240000000000",  # r2 = ingress_ifindex
        "5502020003000000", "b400000011006873", "9500000000000000",  # 3 -> :11
        "5502020007000000", "b400000010006873", "9500000000000000",  # 7 -> :10
        "b400000000000000", "9500000000000000",  # no match -> 0
    ]


classids = st.integers(1, 0xFFFFFFFE).filter(lambda c: c & 0xFFFF)


@given(st.dictionaries(st.integers(1, 2**31 - 1), classids, max_size=40))
def test_classifier_semantics_and_determinism(mapping):
    prog = bpf.ifindex_classifier(mapping)
    assert len(prog) == 8 * (3 * len(mapping) + 3)
    items = list(mapping.items())
    random.shuffle(items)
    assert bpf.ifindex_classifier(dict(items)) == prog
    assert bpf.program_name(dict(items)) == bpf.program_name(mapping)
    for ifindex, classid in mapping.items():
        assert interpret(prog, ifindex) == classid
    for other in (0, 2**31, 0xFFFFFFFF):
        assert interpret(prog, other) == 0


def test_empty_mapping_never_matches():
    prog = bpf.ifindex_classifier({})
    assert interpret(prog, 0) == interpret(prog, 5) == 0


def test_size_limit():
    ok = {i: 0x73680010 for i in range(1, bpf.MAX_ENTRIES + 1)}
    assert len(bpf.ifindex_classifier(ok)) // 8 <= 1_000_000
    ok[bpf.MAX_ENTRIES + 1] = 0x73680010
    with pytest.raises(ValueError, match="exceed the classifier limit"):
        bpf.ifindex_classifier(ok)


@pytest.mark.parametrize(
    "mapping",
    [{0: 0x73680010}, {2**31: 0x73680010}, {-1: 0x73680010}, {True: 0x73680010},
     {5: 0}, {5: 0xFFFFFFFF}, {5: 0x73680000}, {5: 2**32}, {5: "7368:10"}],
)
def test_rejects_unusable_entries(mapping):
    with pytest.raises(ValueError):
        bpf.ifindex_classifier(mapping)


def test_program_name_stable_and_valid():
    m = {12: 0x73680010, 4: 0x73680123}
    name = bpf.program_name(m)
    # Pinned: a change here means reconcilers will re-attach every program.
    assert name == "shpd_e3318bac9d"
    assert bpf.program_name({4: 0x73680123, 12: 0x73680010}) == name
    assert re.fullmatch(r"shpd_[0-9a-f]{10}", name)
    assert len(name) <= 15
    assert bpf.program_name({12: 0x73680010, 4: 0x73680124}) != name
    assert bpf.program_name({12: 0x73680010}) != name
    assert bpf.program_name({}) != name


def test_load_rejects_bad_input_before_syscall():
    with pytest.raises(ValueError):
        bpf.load_sched_cls(b"\x95" * 7, "shpd_x")
    with pytest.raises(ValueError):
        bpf.load_sched_cls(bpf.exit_(), "shpd-has-dash")
    with pytest.raises(ValueError):
        bpf.load_sched_cls(bpf.exit_(), "x" * 16)
