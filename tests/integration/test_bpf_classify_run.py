"""The map classifier's bytecode under BPF_PROG_TEST_RUN: crafted packets, skb->priority read back (root, no traffic).

Proves the documented precedence (interface, cgroup, mark, source prefix with
the longest prefix winning), the destination-scope stage, IPv4 and IPv6, and
that unmatched packets keep their skb->priority and every verdict is
TC_ACT_UNSPEC (later clsact programs still run).
"""

import ipaddress
import os
import socket
import struct

import pytest

from shaperd.backends.common import mapcls
from shaperd.backends.common.objects import DstScope
from shaperd.kernel import bpf
from shaperd.backends.common import kernel_classifier as bpf_classify
from shaperd.kernel import bpf_maps

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (bpf)")

T_A, T_B, T_C, T_D, SCOPED = 0x73680010, 0x73680020, 0x73680030, 0x73680040, 0x73680011
MASK = 0x00FF0000
ORIG_PRIO = 5  # what the stack set (e.g. from TOS); must survive a miss


def ipv4(src: str, dst: str) -> bytes:
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28, 0, 0, 64, 17, 0, socket.inet_aton(src), socket.inet_aton(dst))
    return b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + ip + struct.pack("!HHHH", 1, 9, 8, 0) + bytes(18)


def ipv6(src: str, dst: str) -> bytes:
    ip = struct.pack("!IHBB16s16s", 6 << 28, 8, 17, 64, socket.inet_pton(socket.AF_INET6, src),
                     socket.inet_pton(socket.AF_INET6, dst))
    return b"\x02" * 6 + b"\x04" * 6 + b"\x86\xdd" + ip + struct.pack("!HHHH", 1, 9, 8, 0)


@pytest.fixture(scope="module")
def classifier():
    n = ipaddress.ip_network
    want, warnings = mapcls.build(
        MASK,
        ifindex={7: T_D},
        cgroups=(),
        marks={0x00010000: T_C},
        prefixes={n("198.18.0.0/16"): T_A, n("198.18.1.0/24"): T_B, n("2001:db8::/32"): T_A,
                  n("2001:db8:1::/48"): T_B},
        dst_scopes=(DstScope(T_A, n("198.19.9.0/24"), SCOPED), DstScope(T_A, n("2001:db8:ff::/48"), SCOPED)),
    )
    assert not warnings
    maps = bpf_classify.ClassifierMaps.create()
    for role, entries in want.entries.items():
        maps.write(role, list(entries.items()), [])
    fd = bpf_classify.load(maps, MASK, want.name)
    yield fd, maps
    os.close(fd)
    maps.close()


def run(fd, pkt, **ctx):
    res = bpf_maps.test_run(fd, pkt, bpf_maps.SkBuff(priority=ORIG_PRIO, **ctx))
    assert res.retval == bpf.TC_ACT_UNSPEC
    return res.ctx_out.priority


def test_longest_source_prefix_wins_ipv4_and_ipv6(classifier):
    fd, _ = classifier
    assert run(fd, ipv4("198.18.1.5", "198.19.0.1")) == T_B
    assert run(fd, ipv4("198.18.2.5", "198.19.0.1")) == T_A
    assert run(fd, ipv6("2001:db8:1::5", "2001:db8:9::1")) == T_B
    assert run(fd, ipv6("2001:db8:2::5", "2001:db8:9::1")) == T_A


def test_unmatched_packets_keep_their_priority(classifier):
    fd, _ = classifier
    assert run(fd, ipv4("198.19.0.5", "198.18.0.1")) == ORIG_PRIO
    assert run(fd, ipv6("2001:db9::5", "2001:db8::1")) == ORIG_PRIO
    arp = b"\xff" * 6 + b"\x04" * 6 + b"\x08\x06" + bytes(28)
    assert run(fd, arp) == ORIG_PRIO
    assert run(fd, ipv4("198.19.0.5", "198.18.0.1"), mark=0x00020000) == ORIG_PRIO  # mark of no tenant


def test_interface_beats_mark_beats_prefix(classifier):
    fd, _ = classifier
    pkt = ipv4("198.18.1.5", "198.19.0.1")  # prefix says T_B
    assert run(fd, pkt, mark=0x00010000) == T_C
    assert run(fd, pkt, mark=0x00010000, ingress_ifindex=7) == T_D
    assert run(fd, pkt, mark=0xFF01FFFF & ~0x00FE0000) == T_C  # bits outside node.mark_mask are ignored


def test_destination_scope_applies_to_the_tenant_only(classifier):
    fd, _ = classifier
    assert run(fd, ipv4("198.18.2.5", "198.19.9.1")) == SCOPED  # tenant A towards its scope
    assert run(fd, ipv4("198.18.1.5", "198.19.9.1")) == T_B  # tenant B: A's scope is not B's
    assert run(fd, ipv6("2001:db8:2::5", "2001:db8:ff::1")) == SCOPED
    assert run(fd, ipv6("2001:db8:2::5", "2001:db8:fe::1")) == T_A


def test_one_map_write_reclassifies_without_reload(classifier):
    fd, maps = classifier
    pod = ipaddress.ip_network("198.19.0.77/32")
    assert run(fd, ipv4("198.19.0.77", "198.18.0.1")) == ORIG_PRIO
    assert maps.write("src4", [(mapcls.src_key(pod), mapcls.value(T_C))], []) == 1
    assert run(fd, ipv4("198.19.0.77", "198.18.0.1")) == T_C
    assert maps.write("src4", [], [mapcls.src_key(pod)]) == 1
    assert run(fd, ipv4("198.19.0.77", "198.18.0.1")) == ORIG_PRIO


def test_cgroup_stage_loads_and_forwarded_packets_fall_through():
    # TEST_RUN skbs have no socket: bpf_skb_ancestor_cgroup_id returns 0, so the
    # cgroup stage must fall through to the prefix stage (real sockets: traffic test).
    want, _ = mapcls.build(0xFF, {}, ((3, 12345, T_D),), {}, {ipaddress.ip_network("198.18.0.0/16"): T_A})
    with bpf_classify.ClassifierMaps.create() as maps:
        for role, entries in want.entries.items():
            maps.write(role, list(entries.items()), [])
        assert maps.maps["cglevels"].lookup(mapcls.u32_key(0)) == mapcls.u32_key(4)
        fd = bpf_classify.load(maps, 0xFF, want.name)
        try:
            assert run(fd, ipv4("198.18.3.3", "198.19.0.1")) == T_A
        finally:
            os.close(fd)
