"""Pure parts of kernel/bpf_maps: LPM key layout, the map-fd ld_imm64, struct sizes."""

import ctypes
import struct

import pytest

from shaperd.kernel import bpf_maps


def test_lpm_key_is_host_order_prefixlen_then_network_order_data():
    key = bpf_maps.lpm_key(24, bytes([198, 18, 1, 0]))
    assert key == struct.pack("=I", 24) + b"\xc6\x12\x01\x00"
    with pytest.raises(ValueError, match="prefix length 33"):
        bpf_maps.lpm_key(33, bytes(4))


def test_ld_map_fd_is_two_slots_with_pseudo_map_fd_source():
    insn = bpf_maps.ld_map_fd(1, 7)
    assert len(insn) == 16
    code, regs, off, imm = struct.unpack("<BBhI", insn[:8])
    assert (code, regs & 0xF, regs >> 4, off, imm) == (0x18, 1, bpf_maps.BPF_PSEUDO_MAP_FD, 0, 7)
    assert insn[8:] == bytes(8)
    with pytest.raises(ValueError):
        bpf_maps.ld_map_fd(11, 7)


def test_sk_buff_layout_matches_uapi_offsets():
    # offsets from include/uapi/linux/bpf.h struct __sk_buff
    S = bpf_maps.SkBuff
    assert ctypes.sizeof(S) == 192
    assert (S.mark.offset, S.priority.offset, S.ingress_ifindex.offset, S.ifindex.offset) == (8, 32, 36, 40)
    assert (S.tc_classid.offset, S.data.offset, S.tstamp.offset, S.hwtstamp.offset) == (72, 76, 152, 184)


def test_percpu_value_pads_each_slot_to_8_bytes():
    m = bpf_maps.BpfMap(-1, bpf_maps.MAP_PERCPU_ARRAY, 4, 4, 1)
    v = m.percpu_value(b"\x01\x00\x00\x00")
    assert len(v) == 8 * bpf_maps.possible_cpus() == m.value_bytes
    assert v[:8] == b"\x01" + bytes(7)


def test_create_map_rejects_unknown_type_and_bad_name():
    with pytest.raises(ValueError, match="map type 99"):
        bpf_maps.create_map(99, 4, 4, 1)
    with pytest.raises(ValueError, match="name"):
        bpf_maps.create_map(bpf_maps.MAP_HASH, 4, 4, 1, name="bad name!")
