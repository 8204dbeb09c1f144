"""The map classifier's destination-keyed variant under BPF_PROG_TEST_RUN: crafted packets, skb->priority read back.

What arrives for a tenant's addresses gets its class on the IFB (IPv4 and IPv6, longest destination prefix
first); a packet whose source alone matches, one of no tenant and one that is not IP keep their
skb->priority; every verdict is TC_ACT_UNSPEC. Root (bpf), no traffic.
"""

import ipaddress
import os

import pytest

from shaperd.backends.common import kernel_classifier as bpf_classify
from shaperd.backends.common import mapcls
from shaperd.kernel import bpf, bpf_maps

from .test_bpf_classify_run import ORIG_PRIO, ipv4, ipv6

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (bpf)")

T_A, T_B = 0x73690010, 0x73690020


@pytest.fixture(scope="module")
def classifier():
    n = ipaddress.ip_network
    want = mapcls.build_dst({n("198.18.20.0/24"): T_A, n("198.18.20.7/32"): T_B, n("2001:db8:20::/48"): T_A,
                             n("2001:db8:20:1::/64"): T_B})
    maps = bpf_classify.ClassifierMaps.create(want.key)
    assert set(maps.maps) == {"src4", "src6"}  # only the address tries: what the variant's program holds
    for role, entries in want.entries.items():
        maps.write(role, list(entries.items()), [])
    fd = bpf_classify.load(maps, want.mark_mask, want.name, want.key)
    yield fd
    os.close(fd)
    maps.close()


def run(fd, pkt, **ctx):
    res = bpf_maps.test_run(fd, pkt, bpf_maps.SkBuff(priority=ORIG_PRIO, **ctx))
    assert res.retval == bpf.TC_ACT_UNSPEC
    return res.ctx_out.priority


def test_the_destination_picks_the_class_longest_prefix_first(classifier):
    assert run(classifier, ipv4("198.51.100.1", "198.18.20.5")) == T_A
    assert run(classifier, ipv4("198.51.100.1", "198.18.20.7")) == T_B
    assert run(classifier, ipv6("2001:db8:99::1", "2001:db8:20::5")) == T_A
    assert run(classifier, ipv6("2001:db8:99::1", "2001:db8:20:1::5")) == T_B


def test_the_source_does_not_classify_and_others_keep_their_priority(classifier):
    assert run(classifier, ipv4("198.18.20.5", "198.51.100.1")) == ORIG_PRIO  # the tenant's address as source
    assert run(classifier, ipv6("2001:db8:20::5", "2001:db8:99::1")) == ORIG_PRIO
    assert run(classifier, ipv4("198.51.100.1", "198.18.21.5")) == ORIG_PRIO  # no tenant's
    arp = b"\xff" * 6 + b"\x04" * 6 + b"\x08\x06" + bytes(28)
    assert run(classifier, arp) == ORIG_PRIO
    # The other stages are not in this program: an interface or a mark never classifies here.
    assert run(classifier, ipv4("198.51.100.1", "198.51.100.2"), mark=0x0E, ingress_ifindex=7) == ORIG_PRIO
