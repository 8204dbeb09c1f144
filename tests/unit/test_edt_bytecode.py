"""The stamper's bytecode, without a kernel: jumps land on instructions, maps are referenced by their fds."""

import struct

from shaperd.backends.edt import kernel_stamper as edt_prog


def insns(code: bytes):
    return [struct.unpack_from("<BBhI", code, i) for i in range(0, len(code), 8)]


def test_every_jump_lands_inside_the_program_and_not_in_a_ld_imm64_second_slot():
    code = edt_prog.stamper(rates_fd=11, clocks_fd=12, stats_fd=13, horizon_ns=50_000_000, parents_fd=14)
    prog = insns(code)
    second_slots = {i + 1 for i, (op, *_rest) in enumerate(prog) if op == 0x18}
    for pc, (op, regs, off, imm) in enumerate(prog):
        cls = op & 0x07
        if cls in (0x05, 0x06) and op not in (0x85, 0x95):  # jumps, not call/exit
            target = pc + 1 + off
            assert 0 <= target < len(prog) and target not in second_slots, (pc, hex(op), off)
    # The four maps, by fd, as BPF_PSEUDO_MAP_FD loads (src_reg 1).
    fds = {imm for op, regs, _off, imm in prog if op == 0x18 and regs >> 4 == 1}
    assert fds == {11, 12, 13, 14}
    # Two clock steps (the key's own, its parent's): each one cmpxchg and the fetch-add fallback, 64-bit atomics.
    atomics = [imm for op, _r, _o, imm in prog if op == 0xDB]
    assert atomics.count(0xF1) == 2 and atomics.count(0x01) == 2
    assert prog[-1][0] == 0x95


def test_the_horizon_must_fit_the_32_bit_immediate():
    import pytest

    with pytest.raises(ValueError, match="horizon"):
        edt_prog.stamper(1, 2, 3, horizon_ns=2**31, parents_fd=4)
