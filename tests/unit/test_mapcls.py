"""Pure parts of the eBPF map classifier: key encoding, desired entries, entry diff, operations."""

import ipaddress
import struct

from shaperd.backends.common import mapcls

n = ipaddress.ip_network


def test_keys_are_host_order_lengths_and_network_order_addresses():
    assert mapcls.src_key(n("198.18.1.0/24")) == struct.pack("=I", 24) + bytes([198, 18, 1, 0])
    assert mapcls.src_key(n("2001:db8::/32"))[:4] == struct.pack("=I", 32)
    assert len(mapcls.src_key(n("2001:db8::/32"))) == mapcls.MAP_SHAPES["src6"][1]
    k = mapcls.dst_key(0x73680010, n("198.19.9.0/24"))
    assert k == struct.pack("=I", 56) + b"\x73\x68\x00\x10" + bytes([198, 19, 9, 0])
    assert len(mapcls.dst_key(0x73680010, n("2001:db8::/48"))) == mapcls.MAP_SHAPES["dst6"][1]
    assert mapcls.decode_key("dst4", k) == "7368:10 -> 198.19.9.0/24"
    assert mapcls.decode_key("src4", mapcls.src_key(n("198.18.1.0/24"))) == "198.18.1.0/24"


def test_build_masks_marks_packs_cgroup_levels_and_warns_beyond_four():
    c, w = mapcls.build(0xFF00, {}, ((2, 11, 0x73680010), (5, 12, 0x73680020)), {0x1234: 0x73680010, 0x34: 1}, {})
    assert w == []
    assert c.entries["mark"] == {mapcls.u32_key(0x1200): mapcls.value(0x73680010)}  # 0x34 & mask == 0: dropped
    lv = c.entries["cglevels"]
    assert [struct.unpack("=I", lv[mapcls.u32_key(i)])[0] for i in range(4)] == [3, 6, 0, 0]
    _, w = mapcls.build(0xFF, {}, tuple((lvl, 100 + lvl, 0x73680010) for lvl in range(6)), {}, {})
    assert len(w) == 1 and "6 distinct levels" in w[0]


def test_in_sync_diff_is_empty_and_one_pod_ip_is_one_op_with_one_entry():
    prefixes = {n(f"198.18.{i // 256}.{i % 256}/32"): 0x73680010 for i in range(1000)}
    want, _ = mapcls.build(0xFF, {3: 0x73680020}, (), {}, prefixes)
    have = mapcls.ObservedMapClassifier(want.name, prog_id=9, handle=0x7368, prio=0x7368,
                                        entries={r: dict(e) for r, e in want.entries.items()})
    assert mapcls.diff("up0", 2, want, have) == []
    more, _ = mapcls.build(0xFF, {3: 0x73680020}, (), {}, {**prefixes, n("198.19.0.1/32"): 0x73680010})
    ops = mapcls.diff("up0", 2, more, have)
    assert len(ops) == 1 and isinstance(ops[0], mapcls.UpdateClassifierMap)
    assert (ops[0].role, len(ops[0].upserts), ops[0].deletes, ops[0].prog_id) == ("src4", 1, (), 9)
    fewer, _ = mapcls.build(0xFF, {}, (), {}, prefixes)
    (op,) = mapcls.diff("up0", 2, fewer, have)
    assert op.role == "ifindex" and op.deletes == (mapcls.u32_key(3),) and op.upserts == ()


def test_changed_value_is_an_upsert_and_other_versions_are_replaced():
    want, _ = mapcls.build(0xFF, {3: 0x73680020}, (), {}, {})
    stale = {r: dict(e) for r, e in want.entries.items()}
    stale["ifindex"][mapcls.u32_key(3)] = mapcls.value(0x73680030)
    have = mapcls.ObservedMapClassifier(want.name, 9, 0x7368, 0x7368, stale)
    (op,) = mapcls.diff("up0", 2, want, have)
    assert op.upserts == ((mapcls.u32_key(3), mapcls.value(0x73680020)),)
    other = mapcls.ObservedMapClassifier(mapcls.program_name(0xF0), 9, 0x7368, 0x7368, stale)
    (op,) = mapcls.diff("up0", 2, want, other)
    assert isinstance(op, mapcls.AttachMapClassifier) and "another version" in op.describe()
    assert isinstance(mapcls.diff("up0", 2, None, other)[0], mapcls.DetachMapClassifier)
    assert mapcls.diff("up0", 2, None, None) == []


def test_program_name_is_a_valid_bpf_name_and_recognisable():
    name = mapcls.program_name(0xFFFF)
    assert len(name) == 15 and mapcls.is_ours(name) and name != mapcls.program_name(0xFF)
